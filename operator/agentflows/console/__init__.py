"""The web console (``agentflows console``): runs, run details, flows and the requests inbox.

Pages are rendered on the server with every value escaped (:mod:`.markup`); the one script,
``static/console.js``, only opens server-sent event streams and writes text into the page. The
console never decides with its own authority: every API call is made as the signed-in user
(:mod:`.identity`). Package map: :mod:`.app` (routes and security headers), :mod:`.pages_runs`,
:mod:`.pages_requests`, :mod:`.pages_flows`, :mod:`.local_pages` (``--local``), :mod:`.live`
(one shared watch per filter, fanned out over SSE), :mod:`.forms` (JSON Schema forms).
"""
