"""`mcp-gateway console`: the web console (docs/console.md) on the gateways' database.

sessions.py (sign-in, CSRF, rate limit), html.py (markup escaped by construction), copy.py
(en-US, pt-BR), views.py (what each page reads and who may see it), app.py (routes and headers),
serve.py (the listening rules and uvicorn), static/ (the page's own CSS and JS: no third party).
"""
