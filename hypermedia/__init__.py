"""hypermedia: a processing platform for user files.

Importing the package is cheap on purpose: nothing here pulls in SQLAlchemy,
Redis or Ray. Import the module you need (``hypermedia.ingest.service``,
``hypermedia.queue.redis_queue`` ...).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
