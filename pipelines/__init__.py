"""Processing pipelines: pure steps ``run(input, params, workdir) -> outputs``,
registered by operation name (:mod:`pipelines.registry`): images (``thumbnail``,
``resize``, ``compress``, ``convert``), PDF (``pdf_preview``), office documents
(``docx_to_pdf``, ``extract_text``) and media (``transcode_video``,
``transcode_audio``). Their parameters share one set of checks
(:mod:`pipelines.params`). Pipelines import neither the core nor the autoscaler.
"""
