"""The web dashboard and ``/metrics`` of the job service, mounted on the API's FastAPI app by
``dyntrain.service.server.create_app`` (``mount.mount_dashboard``).

The stack, chosen to stay small and work with no internet access: pages rendered on the server
(Jinja2, already a dependency of torch and a standard companion of FastAPI), a few hundred lines
of plain JavaScript (``static/dashboard.js``: polling, swapping re-rendered sections, charts,
following logs, actions) and one charting library, uPlot (``static/uPlot.*``, MIT licence,
vendored from the npm registry): 50 kB, no dependencies, made for time series (stepped lines
for world sizes, thousands of points per chart drawn on a canvas). Every file ships inside this
package; no page loads anything from another host.

Routes (``pages.py``, mounted by ``mount.py``): ``/`` (overview), ``/ui/jobs/{id}``,
``/ui/lab``, ``/ui/login``; ``/metrics`` (``metrics.py``); static files under
``/ui/static/``. The token rule is the API's (``auth.py`` is its browser session). The lab
page's reports come from a ``lab.LabReport`` handed in at assembly: nothing here imports the
lab, the API or the AWS front end. Nothing here appears in the API's
OpenAPI document, and the dashboard answers GET ``/`` only (other front ends may own other
methods on ``/``).
"""
