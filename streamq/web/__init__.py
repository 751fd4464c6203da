"""``streamq web``: a dashboard to see and steer queues from a browser.

A Starlette application on uvicorn: server-rendered Jinja2 templates (every value
escaped), live updates over Server-Sent Events, charts drawn as inline SVG by the
server, one small script and no JavaScript build step. Reads run with the inspector
role's credentials, actions with the admin role's; see :mod:`streamq.web.app`.
Needs the ``web`` extra (``pip install 'streamq[web]'``).
"""
