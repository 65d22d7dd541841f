"""The service's pure core: its vocabulary (``model``), the scheduler, job lifecycles, capacity
traces, cost, the executor interface and what a submitter hands a job; no database, no process,
no network."""
