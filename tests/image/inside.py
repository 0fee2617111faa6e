"""Python run inside the container by tests/image/checks.py (`podman run ... python -c`), printing JSON."""

# Run inside the container: what the image holds (the installed package's data files, a source tree, build tools).
CONTENTS = """
import json, os, pathlib, shutil, bot
package = pathlib.Path(bot.__file__).resolve().parent
sources, projects = [], []
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    if "__init__.py" in files and os.path.basename(root) == "bot" and pathlib.Path(root).resolve() != package:
        sources.append(root)
    if "pyproject.toml" in files and "gpu-alert-bot" in open(os.path.join(root, "pyproject.toml")).read():
        projects.append(root)
print(json.dumps({
    "package": str(package),
    "playbooks": sorted(p.name for p in (package / "bundled_playbooks").glob("*")),
    "rules": sorted(p.name for p in (package / "bundled_rules").glob("*")),
    "sources": sources + projects + [p for p in ("/src", "/wheels") if os.path.exists(p)],
    "tools": [t for t in TOOLS if shutil.which(t)],
}))
"""

# Run inside the container: each process's uid and command line.
PROCESSES = """
import json, pathlib
found = []
for status in pathlib.Path("/proc").glob("[0-9]*/status"):
    try:
        uid = next(int(l.split()[1]) for l in status.read_text().splitlines() if l.startswith("Uid:"))
        cmdline = (status.parent / "cmdline").read_bytes().replace(b"\\0", b" ").decode().strip()
    except (OSError, StopIteration):
        continue
    found.append({"pid": int(status.parent.name), "uid": uid, "cmdline": cmdline})
print(json.dumps(found))
"""

# Run inside the container: one alert picture drawn by the bot's own renderer, as the running bot draws it.
GRAPH = """
import json
from bot.render.graph import AlertGraph, render_alert_graph
graph = AlertGraph(title="GPUTempCritical · image-check GPU 0", subtitle="temperature", unit="°C",
                   points=((0.0, 80.0), (60.0, 95.0)), window=(0.0, 60.0), started_at=30.0, threshold=90.0)
png = render_alert_graph(graph)
print(json.dumps({"bytes": len(png), "png": png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"}))
"""
