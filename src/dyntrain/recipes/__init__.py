"""The large-batch ResNet recipe of the ResNet-50 article: model, LR schedule, optimizer (LARS
optional), mixed precision, augmentations; see ``Recipe`` and ``RECIPES``."""

from dyntrain.recipes.optim import LARS, param_groups
from dyntrain.recipes.precision import PRECISIONS, StaticLossScaler, make_scaler
from dyntrain.recipes.recipe import RECIPES, Recipe, get_recipe
from dyntrain.recipes.resnet import resnet50, small_resnet
from dyntrain.recipes.schedule import LRSchedule, ScheduledLR

__all__ = ["LARS", "PRECISIONS", "RECIPES", "LRSchedule", "Recipe", "ScheduledLR",
           "StaticLossScaler", "get_recipe", "make_scaler", "param_groups", "resnet50",
           "small_resnet"]
