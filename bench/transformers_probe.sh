#!/usr/bin/env bash
# Transformers' model import, the image's version against another installed in its own folder,
# alternated three times each in fresh processes: seconds for torch, transformers.modeling_utils
# and the Llama model code, and whether scikit-learn came along. On the device machine, after
# . bench/device_setup.sh (its bytecode prefix applies to both):
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_tf transformers-5.23.0-*.whl
#     bash bench/transformers_probe.sh /tmp/site_tf
# The first import of each writes its bytecode (PYTHONPYCACHEPREFIX), so the later ones are the warm figures.
set -u
OTHER=${1:?"give the folder the other transformers is installed in"}
for v in image other image other image other; do
    P=${PYTHONPATH:-}
    [ "$v" = other ] && P=$OTHER${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=$P python3 -c "
import sys, time
t = time.time(); import torch
t1 = time.time(); import transformers.modeling_utils, transformers
t2 = time.time(); import transformers.models.llama.modeling_llama
print('$v', transformers.__version__, 'torch', round(t1 - t, 2), 'modeling_utils', round(t2 - t1, 2),
      'llama', round(time.time() - t2, 2), 'sklearn imported:', 'sklearn' in sys.modules)"
done
