"""Cost reports and upgrade plans from the clients' telemetry events and the index.

``cost`` folds graph events, page by page, into the cost report's figures (``figures``,
``misses``, ``runs``), priced by ``prices``; ``upgrade`` estimates what a compiler
upgrade will recompile; ``collect`` reads the stores for both; ``render_text`` and
``render_html`` turn their JSON into CSV, a terminal table or a page. docs/reports.md
says what each figure means.
"""
