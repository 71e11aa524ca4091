"""The service layer: what a request asks the app to do, apart from how it was asked.

One module per topic (runs, slots, pauses, audits), over the app's state (``state``) and
for a principal (``principal``).  It returns values and its own refusals (``errors``),
never an HTTP status and never a Flask or Werkzeug object: the views, the dashboard's forms
and the task endpoints in ``handlers/`` parse a request, call one service function and render
what it returns (``tests/test_layers.py`` holds the rule).
"""
