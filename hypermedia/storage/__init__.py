"""Object storage: the contract (``base``), a local directory (``local``, URLs signed
by ``signing`` and served by the API), an S3 bucket (``s3``); the head's per-job URL
issuer (``grants``) and the worker's side of a transfer (``transfer``)."""
