"""Writes the Parquet and Arrow IPC inputs of parquet_input_test with pyarrow itself
(the writer the corpora people download were written with: datatrove and HuggingFace
datasets use it), and beside each the jsonl that holds the same documents, which
`dataprep preprocess` must turn into the same bytes.

usage: parquet_inputs.py SOURCE_JSONL OUT_DIR

SOURCE_JSONL: {"text": ...} lines (the fortunes corpus of the test fixtures). Writes to
OUT_DIR:
  codec-{none,snappy,zstd,gzip,lz4,brotli}.parquet: FineWeb's columns (text, id, url,
      score: the others ignored) and title, meta, 29 rows a row group (25 row groups);
  plain-encoding.parquet: no dictionary encoding; dictionary-type.parquet: text stored
      as an Arrow dictionary type; large-string.parquet, binary.parquet,
      string-view.parquet: the text column in those types;
  one-row-group.parquet: the whole table in one row group;
  expected.jsonl: {"text", "title"} of every row, in order.
  with-nulls.parquet: text null at rows 5 and 40 (row groups 0 and 1 at 29 rows a
      group); expected-without-nulls.jsonl: the other rows.
  bad-utf8.parquet: a binary column whose row 3 is not UTF-8.
  ints.parquet: a column "text" of int64.
  file.arrow (IPC file format), stream.arrow (IPC stream format, as datasets'
      save_to_disk writes it, 50 rows a record batch), stream-zstd.arrow (buffers
      compressed with zstd).
  not-named.bin: codec-zstd.parquet's bytes under a name that says nothing.
  empty.parquet: the schema and no rows (expected-empty.jsonl: no lines);
  zero-bytes.parquet: no bytes at all; corrupt-footer.parquet: the footer's metadata
      overwritten (its length and magic intact); corrupt-page.parquet: the page header
      of row group 3's text column zeroed (pyarrow itself cannot read it).
"""
import json
import os
import shutil
import sys

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

ROWS = 700
ROW_GROUP = 29


def main():
    source, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    texts = []
    with open(source, encoding="utf-8") as lines:
        for line in lines:
            texts.append(json.loads(line)["text"])
            if len(texts) == ROWS:
                break
    titles = [f"fortune {i}: " + text[:12] for i, text in enumerate(texts)]
    table = pa.table({
        "text": pa.array(texts, pa.string()),
        "id": pa.array([f"<urn:uuid:{i:08x}>" for i in range(len(texts))], pa.string()),
        "url": pa.array([f"https://example.org/fortune/{i}" for i in range(len(texts))], pa.string()),
        "score": pa.array([(i % 17) / 4.0 for i in range(len(texts))], pa.float64()),
        "title": pa.array(titles, pa.string()),
        "meta": pa.array([{"n": i} for i in range(len(texts))]),
    })

    def write_jsonl(name, rows):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            for text, title in rows:
                f.write(json.dumps({"text": text, "title": title}, ensure_ascii=False) + "\n")

    write_jsonl("expected.jsonl", zip(texts, titles))
    for codec in ("none", "snappy", "zstd", "gzip", "lz4", "brotli"):
        pq.write_table(table, os.path.join(out, f"codec-{codec}.parquet"), compression=codec,
                       row_group_size=ROW_GROUP)
    pq.write_table(table, os.path.join(out, "plain-encoding.parquet"), use_dictionary=False,
                   row_group_size=ROW_GROUP)
    pq.write_table(table, os.path.join(out, "one-row-group.parquet"))

    def with_text(array):
        return table.set_column(table.schema.get_field_index("text"), "text", array)

    pq.write_table(with_text(pa.array(texts, pa.string()).dictionary_encode()),
                   os.path.join(out, "dictionary-type.parquet"), row_group_size=ROW_GROUP)
    pq.write_table(with_text(pa.array(texts, pa.large_string())), os.path.join(out, "large-string.parquet"),
                   row_group_size=ROW_GROUP)
    pq.write_table(with_text(pa.array([t.encode() for t in texts], pa.binary())),
                   os.path.join(out, "binary.parquet"), row_group_size=ROW_GROUP)
    pq.write_table(with_text(pa.array(texts, pa.string_view())), os.path.join(out, "string-view.parquet"),
                   row_group_size=ROW_GROUP, store_schema=True)

    nulls = {5, 40}
    pq.write_table(with_text(pa.array([None if i in nulls else t for i, t in enumerate(texts)], pa.string())),
                   os.path.join(out, "with-nulls.parquet"), row_group_size=ROW_GROUP)
    write_jsonl("expected-without-nulls.jsonl",
                [(t, titles[i]) for i, t in enumerate(texts) if i not in nulls])
    raw = [t.encode() for t in texts]
    raw[3] = b"caf\xe9 \xff"
    pq.write_table(with_text(pa.array(raw, pa.binary())), os.path.join(out, "bad-utf8.parquet"),
                   row_group_size=ROW_GROUP)
    pq.write_table(with_text(pa.array(range(len(texts)), pa.int64())), os.path.join(out, "ints.parquet"))

    batches = table.drop_columns(["meta", "url", "score"]).to_batches(max_chunksize=50)
    with ipc.new_file(os.path.join(out, "file.arrow"), batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    with ipc.new_stream(os.path.join(out, "stream.arrow"), batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    options = ipc.IpcWriteOptions(compression="zstd")
    with ipc.new_stream(os.path.join(out, "stream-zstd.arrow"), batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    shutil.copyfile(os.path.join(out, "codec-zstd.parquet"), os.path.join(out, "not-named.bin"))

    pq.write_table(table.slice(0, 0), os.path.join(out, "empty.parquet"))
    write_jsonl("expected-empty.jsonl", [])
    open(os.path.join(out, "zero-bytes.parquet"), "wb").close()
    with open(os.path.join(out, "codec-snappy.parquet"), "rb") as f:
        whole = bytearray(f.read())
    footer_length = int.from_bytes(whole[-8:-4], "little")
    footer_start = len(whole) - 8 - footer_length
    whole[footer_start + footer_length // 3:footer_start + footer_length // 3 + 64] = b"\xff" * 64
    with open(os.path.join(out, "corrupt-footer.parquet"), "wb") as f:
        f.write(whole)
    corrupt_page = os.path.join(out, "corrupt-page.parquet")
    pq.write_table(table, corrupt_page, compression="none", use_dictionary=False, row_group_size=ROW_GROUP)
    text_column = table.schema.get_field_index("text")
    offset = pq.ParquetFile(corrupt_page).metadata.row_group(3).column(text_column).data_page_offset
    with open(corrupt_page, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 24)
    try:
        pq.read_table(corrupt_page)
    except Exception:  # noqa: BLE001 - any failure of pyarrow's own reader will do
        pass
    else:
        sys.exit("parquet_inputs: corrupt-page.parquet is still readable: the fixture tests nothing")
    print(f"parquet_inputs: {len(texts)} rows, {len(os.listdir(out))} files in {out}")


if __name__ == "__main__":
    main()
