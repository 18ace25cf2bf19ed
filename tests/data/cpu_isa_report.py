"""Writes which CPU vector ISAs inductor may use here, and whether this
process knew them before asking (inherited from the process it was forked
from), to OUT/isa-rank{RANK}.json."""

import json
import os
import sys
from pathlib import Path

from torch._inductor import cpu_vec_isa

known_at_start = cpu_vec_isa.valid_vec_isa_list.cache_info().currsize > 0
isas = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rank = os.environ.get("RANK", "0")
report = {"isas": isas, "known_at_start": known_at_start}
(out / f"isa-rank{rank}.json").write_text(json.dumps(report))
