"""The job service: compute environments, job queues, job definitions, jobs and the scheduler."""
