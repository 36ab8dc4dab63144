"""Processing pipelines: pure steps ``run(input, params, workdir) -> outputs``,
registered by operation name. Pipelines import neither the core nor the autoscaler.

The image, document, OCR and media pipelines arrive with the workers issue; until
then no operation is executed, only recorded and queued.
"""
