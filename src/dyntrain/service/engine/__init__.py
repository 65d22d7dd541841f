"""The service's engine: the controller and what it drives (attempts, the job index, elastic jobs'
coordinators), and ``Service``, which runs it over a store and an executor."""
