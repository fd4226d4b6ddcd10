#!/usr/bin/env bash
# Install msprof-analyze and mindstudio-probe 26.2.0 OUTSIDE the project venv, into a --target folder that the
# bench/field_tools scripts put on PYTHONPATH. The project venv supplies everything it already pins (numpy
# 1.26.4, pandas, protobuf 3.20.1, ...); only the packages it lacks go into the folder, at versions the resolver
# chose against the venv's own (uv pip compile requirements.txt + the two tools, constrained by pip freeze).
# Left out on purpose: skl2onnx and onnx (msprobe requires skl2onnx -> onnx; every onnx wheel for CPython 3.11
# requires protobuf >= 3.20.2, the pin is 3.20.1 for mindinsight; see docs/field_tools.md). Nothing that the
# scripts here run imports them.
# Usage: bash bench/field_tools/install_tools.sh [TARGET]   (default /tmp/tools-site)
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
py="$here/.venv/bin/python"
target="${1:-/tmp/tools-site}"
"$py" -m pip install --no-deps --target "$target" \
  mindstudio-probe==26.2.0 msprof-analyze==26.2.0 \
  absl-py==2.5.1 einops==0.8.2 et-xmlfile==2.0.0 ijson==3.6.0 markdown==3.11.3 networkx==3.6.1 \
  openpyxl==3.1.5 plotly==7.1.0 prettytable==3.19.0 pytz==2026.6 sqlalchemy==2.1.9 \
  tensorboard==2.20.0 tensorboard-data-server==0.7.2
PYTHONPATH="$target" "$py" -c "import msprobe, msprof_analyze; print('msprobe and msprof_analyze import from', '$target')"
