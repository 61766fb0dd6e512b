"""PyMongo's unified-format specification tests for change streams and transactions.

The test classes are made by PyMongo's own runner (`test.unified_format`, from its source
distribution, which `run_spec.py` downloads and puts on the path) from the JSON files of
`test/change_streams/unified`, `test/transactions/unified` and
`test/transactions-convenient-api/unified` (the `with_transaction` helper). The last directory's
classes take the prefix `ConvenientApi`, as two of its file names are also transactions files.
"""

import os

from test.unified_format import generate_test_classes

SPEC_DIRS = (
    ("change_streams/unified", ""),
    ("transactions/unified", ""),
    ("transactions-convenient-api/unified", "ConvenientApi"),
)

_root = os.environ["MONGO_SIM_SPEC_TESTS"]
for _dir, _prefix in SPEC_DIRS:
    globals().update(
        generate_test_classes(
            os.path.join(_root, _dir), module=__name__, class_name_prefix=_prefix
        )
    )
