"""Differential test of the canonical token text against PyMongo.

The baseline task derives an event's ID as sha256(json_util.dumps(token, sort_keys=True)) of the
token PyMongo decoded from the server's BSON. Random token-like documents (a `_data` string plus
fields of every BSON type, tricky strings, nested documents and arrays) are written as BSON by hand,
decoded and printed by PyMongo, and recorded as the `_id` tokens of a change stream; `handoff
replay` hands them off and every outbox `_id` must be `<consumer>/<sha256 of PyMongo's text>`.

The seed is printed on failure; HANDOFF_TOKEN_SEED=N reruns one, HANDOFF_TOKEN_DOCS=N sets how many
documents each seed makes.
"""

import base64
import hashlib
import json
import math
import os
import random
import struct
import subprocess

import bson
from bson import json_util
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.decimal128 import Decimal128

from handoff_cli import HANDOFF_BIN

CONSUMER = "orders-to-outbox"
SEEDS = [int(s) for s in os.environ.get("HANDOFF_TOKEN_SEED", "20261201,7,424242").split(",")]
DOCS = int(os.environ.get("HANDOFF_TOKEN_DOCS", "160"))
# The last millisecond PyMongo prints as an ISO date, and the range of an int32 / int64.
MAX_ISO_MS = 253402300799999
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# PyMongo decodes dates out of Python's range as DatetimeMS instead of failing; it prints them as
# it prints every date outside its ISO range.
DECODE = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)

TRICKY = [
    "", " ", "~", "\x7f", "\x00", "\x01", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1b", "\x1f",
    "\x80", "\x85", "\x9f", "\xa0", "\xe9", "\xff", "\u0100", "\u2028", "\u2029", "\u200b", "\u202e",
    "\ud7ff", "\ue000", "\ufeff", "\ufffd", "\uffff", "\U00010000", "\U0001f600", "\U0010ffff",
    '"', "\\", "/", "\\u0041", "'", "{", "}", "[", "]", ":", ",", "$", ".", "日本", "é\u0301",
]


# --- A tagged value: (type, payload). Written as BSON bytes and as canonical Extended JSON. ---


def rand_string(rng, allow_nul=True):
    parts = []
    for _ in range(rng.randrange(0, 6)):
        pick = rng.random()
        if pick < 0.45:
            parts.append(rng.choice(TRICKY))
        elif pick < 0.8:
            parts.append("".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(rng.randrange(1, 6))))
        else:
            parts.append(chr(rng.choice([rng.randrange(0, 0xD800), rng.randrange(0xE000, 0x110000)])))
    text = "".join(parts)
    return text if allow_nul else text.replace("\x00", "")


def rand_key(rng):
    key = rand_string(rng, allow_nul=False)
    if key.startswith("$"):
        key = "k" + key
    return key or rng.choice(["a", "b", "_id", "z", "A", "k"])


def rand_double(rng):
    pick = rng.randrange(10)
    if pick == 0:
        return rng.choice([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 5e-324, -5e-324,
                           2.2250738585072014e-308, 1.7976931348623157e308, 1e16, 1e15, 1e-4, 1e-5,
                           0.1, 0.1 + 0.2, 1 / 3, 123456789012345678.0, 9007199254740993.0])
    if pick < 4:
        return float(rng.randrange(-(10**18), 10**18)) / rng.choice([1, 10, 1000, 2**20])
    if pick < 6:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-30, 30)
    bits = rng.getrandbits(64)
    value = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


def rand_decimal(rng):
    pick = rng.randrange(8)
    if pick == 0:
        return rng.choice(["Infinity", "-Infinity", "NaN", "0", "-0", "0E+3", "0E-7", "-0.000"])
    digits = str(rng.randrange(1, 10 ** rng.randrange(1, 35)))
    exponent = rng.choice([0, 0, -2, rng.randrange(-6176, 6112 - len(digits) + 1), rng.randrange(-40, 40)])
    exponent = max(-6176, min(exponent, 6111))
    sign = rng.choice(["", "-"])
    return f"{sign}{digits}E{exponent}"


def rand_date(rng):
    pick = rng.randrange(8)
    if pick == 0:
        return rng.choice([0, -1, 1, 100, 999, 1000, MAX_ISO_MS, MAX_ISO_MS + 1, -62135596800000,
                           -62135596800001, 253402300800000 + 86400000 * 400, INT64[0], INT64[1],
                           951782400010, 1700000000100, 1700000000000])
    base = rng.choice([rng.randrange(0, MAX_ISO_MS + 1), rng.randrange(-(10**14), 0),
                       rng.randrange(MAX_ISO_MS, 10**16)])
    return base - base % 1000 + rng.choice([0, 0, 100, 10, 1, 120, 999, rng.randrange(1000)])


def rand_scalar(rng):
    kind = rng.choice([
        "str", "str", "int32", "int64", "double", "double", "bool", "null", "oid", "date", "date",
        "ts", "bin", "regex", "dec", "code", "codews", "minkey", "maxkey", "symbol", "undefined",
        "dbpointer",
    ])
    if kind == "str":
        return ("str", rand_string(rng))
    if kind == "int32":
        return ("int32", rng.choice([0, -1, 1, INT32[0], INT32[1], rng.randrange(*INT32)]))
    if kind == "int64":
        return ("int64", rng.choice([0, 5, -7, INT64[0], INT64[1], INT32[1] + 1, rng.randrange(*INT64)]))
    if kind == "double":
        return ("double", rand_double(rng))
    if kind == "bool":
        return ("bool", rng.random() < 0.5)
    if kind == "null":
        return ("null", None)
    if kind == "oid":
        return ("oid", rng.randbytes(12))
    if kind == "date":
        return ("date", rand_date(rng))
    if kind == "ts":
        return ("ts", (rng.choice([0, 1, 2**32 - 1, rng.getrandbits(32)]), rng.choice([0, 1, 2**32 - 1, rng.getrandbits(32)])))
    if kind == "bin":
        subtype = rng.choice([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0xFF])
        # PyMongo refuses a UUID subtype (3, 4) of another length than 16.
        size = 16 if subtype in (3, 4) else rng.randrange(0, 40)
        return ("bin", (rng.randbytes(size), subtype))
    if kind == "regex":
        pattern = rand_string(rng, allow_nul=False)
        options = "".join(rng.sample("imxslu", rng.randrange(0, 7)))
        return ("regex", (pattern, options))
    if kind == "dec":
        return ("dec", rand_decimal(rng))
    if kind == "code":
        return ("code", rand_string(rng))
    if kind == "codews":
        return ("codews", (rand_string(rng), rand_doc(rng, 2)))
    if kind == "symbol":
        return ("symbol", rand_string(rng))
    if kind == "dbpointer":
        return ("dbpointer", (rand_string(rng, allow_nul=False), rng.randbytes(12)))
    return (kind, None)


def rand_dbref(rng, depth):
    """A document PyMongo decodes as a DBRef when embedded ($db a string, null or absent)."""
    pairs = [("$ref", ("str", rand_string(rng, allow_nul=False))), ("$id", rand_value(rng, depth))]
    pick = rng.randrange(3)
    if pick == 1:
        pairs.append(("$db", ("null", None)))
    elif pick == 2:
        pairs.append(("$db", rng.choice([("str", "db"), ("int32", 1)])))
    for _ in range(rng.randrange(0, 3)):
        pairs.append((rand_key(rng), rand_value(rng, depth)))
    rng.shuffle(pairs)
    return ("doc", pairs)


def rand_doc(rng, depth):
    pairs = [(rand_key(rng), rand_value(rng, depth - 1)) for _ in range(rng.randrange(0, 5))]
    if pairs and rng.random() < 0.1:
        pairs.append((pairs[0][0], rand_value(rng, depth - 1)))  # a repeated key: the last wins
    return ("doc", pairs)


def rand_value(rng, depth):
    if depth <= 0 or rng.random() < 0.65:
        return rand_scalar(rng)
    pick = rng.randrange(5)
    if pick == 0:
        return rand_dbref(rng, depth - 1)
    if pick < 3:
        return rand_doc(rng, depth)
    return ("array", [rand_value(rng, depth - 1) for _ in range(rng.randrange(0, 4))])


def rand_token(rng, index):
    data = f"82{index:08X}" + "".join(rng.choice("0123456789ABCDEF") for _ in range(rng.randrange(8, 60)))
    pairs = [("_data", ("str", data))]
    for _ in range(rng.randrange(1, 7)):
        pairs.append((rand_key(rng), rand_value(rng, 3)))
    if rng.random() < 0.1:
        # `$ref` and `$id` at the top level: PyMongo does not decode the token itself as a DBRef.
        pairs += [("$ref", ("str", "coll")), ("$id", rand_scalar(rng)), ("$db", ("null", None))]
    rng.shuffle(pairs)
    return ("doc", pairs)


# --- BSON bytes, written by hand so that every type (symbol, undefined, DBPointer) is exact. ---


def cstring(text):
    data = text.encode("utf-8")
    assert b"\x00" not in data
    return data + b"\x00"


def bson_string(text):
    data = text.encode("utf-8") + b"\x00"
    return struct.pack("<i", len(data)) + data


def bson_document(pairs):
    body = b"".join(bson_element(key, value) for key, value in pairs)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def bson_element(key, value):
    kind, v = value
    name = cstring(key)
    if kind == "double":
        return b"\x01" + name + struct.pack("<d", v)
    if kind == "str":
        return b"\x02" + name + bson_string(v)
    if kind == "doc":
        return b"\x03" + name + bson_document(v)
    if kind == "array":
        return b"\x04" + name + bson_document([(str(i), item) for i, item in enumerate(v)])
    if kind == "bin":
        data, subtype = v
        if subtype == 2:
            return b"\x05" + name + struct.pack("<iB", len(data) + 4, 2) + struct.pack("<i", len(data)) + data
        return b"\x05" + name + struct.pack("<iB", len(data), subtype) + data
    if kind == "undefined":
        return b"\x06" + name
    if kind == "oid":
        return b"\x07" + name + v
    if kind == "bool":
        return b"\x08" + name + (b"\x01" if v else b"\x00")
    if kind == "date":
        return b"\x09" + name + struct.pack("<q", v)
    if kind == "null":
        return b"\x0a" + name
    if kind == "regex":
        return b"\x0b" + name + cstring(v[0]) + cstring(v[1])
    if kind == "dbpointer":
        return b"\x0c" + name + bson_string(v[0]) + v[1]
    if kind == "code":
        return b"\x0d" + name + bson_string(v)
    if kind == "symbol":
        return b"\x0e" + name + bson_string(v)
    if kind == "codews":
        inner = bson_string(v[0]) + bson_document(v[1][1])
        return b"\x0f" + name + struct.pack("<i", len(inner) + 4) + inner
    if kind == "int32":
        return b"\x10" + name + struct.pack("<i", v)
    if kind == "ts":
        time, increment = v
        return b"\x11" + name + struct.pack("<II", increment, time)
    if kind == "int64":
        return b"\x12" + name + struct.pack("<q", v)
    if kind == "dec":
        return b"\x13" + name + Decimal128(v).bid
    if kind == "minkey":
        return b"\xff" + name
    if kind == "maxkey":
        return b"\x7f" + name
    raise AssertionError(kind)


# --- Canonical Extended JSON text, written by hand so that repeated keys survive. ---


def js(text, rng):
    return json.dumps(text, ensure_ascii=rng.random() < 0.5)


def extjson(value, rng):
    kind, v = value
    wrap = lambda key, inner: "{" + js(key, rng) + ": " + inner + "}"  # noqa: E731
    if kind == "str":
        return js(v, rng)
    if kind == "double":
        if math.isnan(v):
            text = "NaN"
        elif math.isinf(v):
            text = "Infinity" if v > 0 else "-Infinity"
        else:
            text = repr(v)
        return wrap("$numberDouble", js(text, rng))
    if kind == "doc":
        return "{" + ", ".join(js(k, rng) + ": " + extjson(item, rng) for k, item in v) + "}"
    if kind == "array":
        return "[" + ", ".join(extjson(item, rng) for item in v) + "]"
    if kind == "bin":
        data, subtype = v
        return wrap("$binary", '{"base64": %s, "subType": "%02x"}' % (js(base64.b64encode(data).decode(), rng), subtype))
    if kind == "undefined":
        return '{"$undefined": true}'
    if kind == "oid":
        return wrap("$oid", js(v.hex(), rng))
    if kind == "bool":
        return "true" if v else "false"
    if kind == "date":
        return wrap("$date", wrap("$numberLong", js(str(v), rng)))
    if kind == "null":
        return "null"
    if kind == "regex":
        return wrap("$regularExpression", '{"pattern": %s, "options": %s}' % (js(v[0], rng), js(v[1], rng)))
    if kind == "dbpointer":
        return wrap("$dbPointer", '{"$ref": %s, "$id": {"$oid": "%s"}}' % (js(v[0], rng), v[1].hex()))
    if kind == "code":
        return wrap("$code", js(v, rng))
    if kind == "symbol":
        return wrap("$symbol", js(v, rng))
    if kind == "codews":
        return '{"$code": %s, "$scope": %s}' % (js(v[0], rng), extjson(v[1], rng))
    if kind == "int32":
        return wrap("$numberInt", js(str(v), rng))
    if kind == "ts":
        return '{"$timestamp": {"t": %d, "i": %d}}' % v
    if kind == "int64":
        return wrap("$numberLong", js(str(v), rng))
    if kind == "dec":
        return wrap("$numberDecimal", js(v, rng))
    if kind == "minkey":
        return '{"$minKey": 1}'
    if kind == "maxkey":
        return '{"$maxKey": 1}'
    raise AssertionError(kind)


def pymongo_text(token):
    """What the baseline hashes: PyMongo's decoding of the token's BSON, printed sorted."""
    return json_util.dumps(bson.decode(bson_document(token[1]), DECODE), sort_keys=True)


def replay(tmp_path, name, lines):
    fixture = tmp_path / f"{name}.jsonl"
    fixture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    state = tmp_path / f"{name}.redb"
    env = {k: v for k, v in os.environ.items() if k not in ("HANDOFF_POLICY", "CONSUMER_ID", "MAX_EVENTS")}
    run = subprocess.run([str(HANDOFF_BIN), "replay", str(fixture), "--state", str(state), "--max-events", "500"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    shown = subprocess.run([str(HANDOFF_BIN), "inspect", "--state", str(state)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    # The checkpoint, then the outbox records in commit order (one JSON object a line).
    documents = [json.loads(line) for line in shown.stdout.split("\n") if line.startswith("{")]
    return [d for d in documents if str(d.get("_id", "")).startswith(CONSUMER + "/")]


def test_the_generator_writes_bson_that_pymongo_reads_back_as_written():
    # The hand-written BSON agrees with PyMongo's own encoder for the types PyMongo can write.
    rng = random.Random(1)
    for _ in range(200):
        kind, value = rand_scalar(rng)
        if kind in ("symbol", "undefined", "dbpointer", "codews"):
            continue
        raw = bson_document([("v", (kind, value))])
        decoded = bson.decode(raw, DECODE)
        if kind == "double" and math.isnan(value):
            assert math.isnan(decoded["v"])
            continue
        assert bson.encode(decoded, codec_options=DECODE) == raw or kind == "regex", (kind, value)


def test_random_tokens_print_byte_identically_to_pymongo(tmp_path):
    print(f"seeds {SEEDS}, {DOCS} tokens each (HANDOFF_TOKEN_SEED, HANDOFF_TOKEN_DOCS)")
    for seed in SEEDS:
        rng = random.Random(seed)
        tokens = [rand_token(rng, i) for i in range(DOCS)]
        lines, expected = [], []
        for i, token in enumerate(tokens):
            text = pymongo_text(token)
            expected.append((token, text))
            event = '{"_id": %s, "operationType": "insert", "ns": {"db": "change_demo", "coll": "orders"}, ' \
                    '"documentKey": {"_id": %d}}' % (extjson(token, rng), i)
            lines.append(event)
        records = replay(tmp_path, f"seed-{seed}", lines)
        assert len(records) == len(tokens), f"seed {seed}: {len(records)} records for {len(tokens)} events"
        for (token, text), record, line in zip(expected, records, lines):
            want = f"{CONSUMER}/{hashlib.sha256(text.encode()).hexdigest()}"
            assert record["_id"] == want, (
                f"seed {seed} (HANDOFF_TOKEN_SEED={seed}): the event ID differs from PyMongo's\n"
                f"fixture line: {line}\nPyMongo text: {text}\nrecorded event: {json.dumps(record['event'])}"
            )


def test_the_old_mistakes_are_covered():
    # The generator reaches the cases an older printer got wrong: DEL and 100 ms dates.
    texts = []
    for seed in SEEDS:
        rng = random.Random(seed)
        texts.extend(pymongo_text(rand_token(rng, i)) for i in range(DOCS))
    joined = "\n".join(texts)
    assert "\\u007f" in joined
    assert any(f'.{ms}Z"' in joined for ms in ("100", "120", "010"))
    assert '"$regularExpression"' in joined and '"$scope"' in joined and '"$numberDecimal"' in joined
