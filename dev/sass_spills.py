"""Where a binary's kernels touch local memory: every STL/LDL of the kernels whose name matches,
with the source line the SASS attributes it to (the binary built with -lineinfo).

  python3 dev/sass_spills.py BINARY [NAME_SUBSTRING]     (needs cuobjdump: the device machine)
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

binary, pattern = os.path.abspath(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(["cuobjdump", "-xelf", "all", binary], cwd=tmp, capture_output=True, check=True)
    sass = "".join(subprocess.run(["nvdisasm", "-g", "-c", f], capture_output=True, text=True).stdout
                   for f in glob.glob(f"{tmp}/*.cubin"))
for func in re.split(r"\n\s*\.text\.", sass)[1:]:
    name = func.split("\n")[0]
    if pattern not in name:
        continue
    line = "?"
    hits = []
    for text in func.split("\n"):
        m = re.search(r"//## File \"(.*?)\", line (\d+)", text)
        if m:
            line = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
        elif "STL" in text or "LDL" in text:
            hits.append(f"  {line:32} {text.strip()[:70]}")
    print(f"{name[:110]}: {len(hits)} local accesses")
    print("\n".join(hits[:60]))
