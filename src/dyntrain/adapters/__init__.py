"""Adapters that build an ``ElasticTrainer`` from training code written for another framework
(``dyntrain.adapters.lightning``: a Lightning ``LightningModule``;
``dyntrain.adapters.transformers``: a Hugging Face ``transformers.Trainer``)."""
