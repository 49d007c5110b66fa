"""Task-level checks: a small, honest pipeline around a model family, so that a built bundle is judged
by what it is for (text read, objects found), not only by tensor metrics.

- ``edgeopt.tasks.ocr``: PP-OCR text detection + recognition (read a page, compare the words).
"""
