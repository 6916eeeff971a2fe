"""Reports of planner results: a self-contained HTML page with plotly figures (``report`` extra).

``rlperf.report.html.write_report`` is the entry point; plotly is imported only when a report
is rendered, so the core package imports without it.
"""
