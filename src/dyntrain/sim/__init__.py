"""``dyntrain sim``: replay capacity and job traces through the service's real scheduler.

``engine`` plays a capacity trace per environment and a job trace on a simulated clock through
``dyntrain.service.core.scheduler.schedule`` and an allocation policy; ``jobs`` reads job traces
(and makes the built-in mixed one); ``compare`` runs policies side by side; ``results`` sums them
up; ``plots`` draws capacity, allocation and jobs over time.
"""
