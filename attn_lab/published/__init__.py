"""The published numbers the experiments put beside ours, each declared once with its source.

One module per group of papers (:mod:`.vaswani`: Vaswani et al., Shazeer, Ainslie et al.; :mod:`.michel`: Michel et
al., Voita et al.; ...). An experiment's findings and tables read them from here, and docs/published.md checks each
one against the paper's text (tests/test_published.py: every number here appears on that page). A researcher's own
experiment declares its papers' numbers the same way, in its own file or package.
"""
