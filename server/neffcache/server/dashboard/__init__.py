"""The dashboard served at ``/``: a page, its script and its stylesheet, shipped inside
the package (clusters are often air-gapped: nothing comes from a CDN). ``page.py``
loads them; ``api/dashboard.py`` serves them."""
