"""The AWS front end: AWS Batch (2016-08-10) and CloudWatch Logs (2014-03-28) wire protocols over
the same store, scheduler and controller as the native API, so unmodified boto3, the AWS CLI and
AWS Batch tooling work against a dyntrain server by changing only the endpoint URL.

``app`` routes and answers requests (``with_aws``), ``sigv4`` checks who may call, ``mapping``
turns requests into dyntrain specs, ``shapes`` turns records into responses, and
``batch_resources``, ``batch_jobs`` and ``logs`` are the operations.
"""
