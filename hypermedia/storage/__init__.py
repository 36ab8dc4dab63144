"""Object storage: the contract (``base``), a local directory (``local``)."""
