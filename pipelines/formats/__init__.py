"""Format readers behind :mod:`hypermedia.sandbox.inspect` and the pipeline steps: pure
parsers of headers and container directories, each reading only through a
:class:`~.source.Source`.

``source``      random access to the bytes being inspected (a file, a buffer, ranged GETs)
``signatures``  what a file is from its first bytes
``images``      dimensions and frame counts from image headers
``media``       audio or video, and the duration, from container headers
``pdf``         encryption (can it be opened without a password?) and page count
``office``      ZIP (OOXML, ODF) and OLE2 containers: bombs, traversal, macros, encryption
``inspection``  all of them together: a file's kind, mime type and facts (step 1 of
                input validation; the rules are the core's)

Nothing here decodes pixels, inflates more than a bounded prefix of a ZIP entry, or
imports anything that does network or database I/O.
"""
