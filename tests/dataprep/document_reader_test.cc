// Tests for DocumentReader, detect_input_format and expand_inputs: exact documents
// from txt and jsonl (plain, .zst, .gz, stdin), every bad-record message with and
// without skipping, and the byte counters used for progress.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/compression.h"
#include "support/stdin_pipe.h"
#include "support/temp_dir_test.h"
#include "dufu/dataprep/document_reader.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::error_of;
using dufu::testing::expect_error;

namespace fs = std::filesystem;
using dufu::testing::gzip_bytes;
using dufu::testing::StdinFromPipe;
using dufu::testing::zstd_bytes;

class DocumentReaderTest : public dufu::testing::TempDirTest {};


struct Doc {
  std::vector<std::string> fields;
  std::string source;
  std::uint64_t line;
  bool operator==(const Doc&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Doc& doc) {
  out << doc.source << ":" << doc.line << " [";
  for (const std::string& field : doc.fields) out << "\"" << field << "\" ";
  return out << "]";
}

std::vector<Doc> read_all_docs(DocumentReader& reader) {
  std::vector<Doc> docs;
  Document doc;  // reused, as the pipeline does
  while (reader.next(&doc)) docs.push_back({doc.fields, doc.source, doc.line});
  return docs;
}

std::vector<Doc> read_all_docs(std::vector<std::string> inputs, ReaderOptions options = {}) {
  DocumentReader reader(std::move(inputs), std::move(options));
  return read_all_docs(reader);
}


TEST(DetectInputFormat, ByExtensionAfterCompression) {
  const InputFormat txt = InputFormat::kTxt, jsonl = InputFormat::kJsonl;
  EXPECT_EQ(detect_input_format("a.jsonl", txt), jsonl);
  EXPECT_EQ(detect_input_format("a.json", txt), jsonl);
  EXPECT_EQ(detect_input_format("a.ndjson", txt), jsonl);
  EXPECT_EQ(detect_input_format("dir/a.jsonl.zst", txt), jsonl);
  EXPECT_EQ(detect_input_format("a.json.zstd", txt), jsonl);
  EXPECT_EQ(detect_input_format("a.jsonl.gz", txt), jsonl);
  EXPECT_EQ(detect_input_format("a.txt", jsonl), txt);
  EXPECT_EQ(detect_input_format("a.txt.zst", jsonl), txt);
  EXPECT_EQ(detect_input_format("a.zst", jsonl), txt);
  EXPECT_EQ(detect_input_format("jsonl", jsonl), txt);
  EXPECT_EQ(detect_input_format("a.jsonl.bak", jsonl), txt);
  EXPECT_EQ(detect_input_format("-", jsonl), jsonl);
  EXPECT_EQ(detect_input_format("-", txt), txt);
}

TEST_F(DocumentReaderTest, TxtLinesAreDocuments) {
  const std::string path = write("a.txt", "first\r\nsecond\n\n\r\nlast without newline");
  EXPECT_EQ(read_all_docs({path}), (std::vector<Doc>{{{"first"}, path, 1},
                                                     {{"second"}, path, 2},
                                                     {{""}, path, 3},
                                                     {{""}, path, 4},
                                                     {{"last without newline"}, path, 5}}));
  // Only one '\r' goes, and only at the end.
  const std::string inner = write("b.txt", "a\rb\r\r\n");
  EXPECT_EQ(read_all_docs({inner}), (std::vector<Doc>{{{"a\rb\r"}, inner, 1}}));
}

TEST_F(DocumentReaderTest, TxtWholeFileIsOneDocument) {
  const std::string a = write("a.txt", "line 1\r\nline 2\n\n");
  const std::string b = write("b.txt", "");
  const std::string c = write("c.txt", "no newline");
  ReaderOptions options;
  options.txt_document = TxtDocument::kFile;
  EXPECT_EQ(read_all_docs({a, b, c}, options), (std::vector<Doc>{{{"line 1\r\nline 2\n\n"}, a, 0},
                                                                 {{""}, b, 0},
                                                                 {{"no newline"}, c, 0}}));
}

TEST_F(DocumentReaderTest, JsonlKeysAndEscapes) {
  const std::string path = write(
      "a.jsonl",
      "{\"text\": \"two\\nlines\", \"title\": \"caf\\u00e9 \\ud83d\\ude00\", \"n\": 1}\n"
      "\n"
      "   \t \r\n"
      "{\"title\": \"\\\"quoted\\\" \\\\ \\/\", \"text\": \"\"}\r\n"
      "{\"text\":\"raw caf\xc3\xa9\",\"title\":\"t\"}");
  ReaderOptions options;
  options.json_keys = {"text", "title"};
  EXPECT_EQ(read_all_docs({path}, options),
            (std::vector<Doc>{{{"two\nlines", "caf\xc3\xa9 \xf0\x9f\x98\x80"}, path, 1},
                              {{"", "\"quoted\" \\ /"}, path, 4},
                              {{"raw caf\xc3\xa9", "t"}, path, 5}}));
}

// A key given twice is read as Python's json.loads (Megatron's preprocess_data.py)
// reads it: the last value, also when the two spellings differ only by escapes.
TEST_F(DocumentReaderTest, JsonlKeyGivenTwiceIsItsLastValue) {
  const std::string path = write("dup.jsonl",
                                 "{\"text\": \"first\", \"text\": \"second\"}\n"
                                 "{\"t\\u0065xt\": \"escaped\", \"title\": \"a\", \"text\": \"plain\", \"title\": \"b\"}\n"
                                 "{\"text\": 5, \"text\": \"a number first\"}\n");
  ReaderOptions options;
  options.json_keys = {"text", "title"};
  options.skip_bad_records = true;
  EXPECT_EQ(read_all_docs({path}, options), (std::vector<Doc>{{{"plain", "b"}, path, 2}}));
  options.json_keys = {"text"};
  EXPECT_EQ(read_all_docs({path}, options),
            (std::vector<Doc>{{{"second"}, path, 1}, {{"plain"}, path, 2}, {{"a number first"}, path, 3}}));
  write("string_first.jsonl", "{\"text\": \"a string first\", \"text\": 5}\n");
  options.skip_bad_records = false;
  expect_error([&] { read_all_docs({dir_.file("string_first.jsonl")}, options); },
               {"string_first.jsonl:1", "key 'text' is not a string"});
}

std::string make_jsonl(std::size_t documents) {
  std::string jsonl;
  for (std::size_t i = 0; i < documents; ++i) {
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": \"document " + std::to_string(i) +
             " says \\\"hi\\\"\\n" + std::string(i % 300, 'a') + "\"}\n";
    if (i % 97 == 0) jsonl += "\n";
  }
  return jsonl;
}

TEST_F(DocumentReaderTest, CompressedInputsGiveTheSameDocuments) {
  const std::string jsonl = make_jsonl(20000);
  const std::string plain = write("d.jsonl", jsonl);
  const std::vector<Doc> expected = read_all_docs({plain});
  ASSERT_EQ(expected.size(), 20000u);
  EXPECT_EQ(expected[5].fields[0], "document 5 says \"hi\"\naaaaa");

  auto with_source = [](std::vector<Doc> docs, const std::string& source) {
    for (Doc& doc : docs) doc.source = source;
    return docs;
  };
  const std::string zst = write("d.jsonl.zst", zstd_bytes(jsonl));
  EXPECT_EQ(read_all_docs({zst}), with_source(expected, zst));
  const std::string gz = write("d.jsonl.gz", gzip_bytes(jsonl));
  EXPECT_EQ(read_all_docs({gz}), with_source(expected, gz));

  // Frames and members split mid-line: the boundary must not show in the documents.
  const std::size_t cut = jsonl.size() / 3 + 17;
  const std::string frames =
      write("frames.jsonl.zst", zstd_bytes(jsonl.substr(0, cut)) + zstd_bytes(jsonl.substr(cut)));
  EXPECT_EQ(read_all_docs({frames}), with_source(expected, frames));
  const std::string members =
      write("members.jsonl.gz", gzip_bytes(jsonl.substr(0, cut)) + gzip_bytes(jsonl.substr(cut)));
  EXPECT_EQ(read_all_docs({members}), with_source(expected, members));

  const std::string txt = "alpha\nbeta\r\n\ngamma";
  const std::string txt_zst = write("t.txt.zst", zstd_bytes(txt));
  const std::string txt_gz = write("t.txt.gz", gzip_bytes(txt));
  const std::vector<Doc> txt_docs = read_all_docs({write("t.txt", txt)});
  ASSERT_EQ(txt_docs.size(), 4u);
  EXPECT_EQ(read_all_docs({txt_zst}), with_source(txt_docs, txt_zst));
  EXPECT_EQ(read_all_docs({txt_gz}), with_source(txt_docs, txt_gz));
}

TEST_F(DocumentReaderTest, LinesLongerThanTheBuffer) {
  const std::string big(5 * (1 << 20) + 7, 'z');
  const std::string path = write("big.jsonl.zst", zstd_bytes("{\"text\": \"small\"}\n{\"text\": \"" + big +
                                                             "\"}\n{\"text\": \"tail\"}\n"));
  EXPECT_EQ(read_all_docs({path}), (std::vector<Doc>{{{"small"}, path, 1}, {{big}, path, 2}, {{"tail"}, path, 3}}));
  const std::string txt = write("big.txt", big + "\n" + big + "x");
  EXPECT_EQ(read_all_docs({txt}), (std::vector<Doc>{{{big}, txt, 1}, {{big + "x"}, txt, 2}}));
}

struct BadCase {
  std::string line;
  std::string what;
};

TEST_F(DocumentReaderTest, EachBadRecordKindThrowsOrIsSkipped) {
  const std::vector<BadCase> cases = {
      {"{\"text\": \"unterminated}", "malformed JSON ("},
      {"{\"text\": \"a\"} trailing", "malformed JSON ("},
      {"{\"text\": \"lone \\ud83d surrogate\"}", "malformed JSON ("},
      {"[\"text\"]", "expected a JSON object"},
      {"\"just a string\"", "expected a JSON object"},
      {"{\"body\": \"x\"}", "missing key 'text'"},
      {"{\"text\": 42}", "key 'text' is not a string (it is a number)"},
      {"{\"text\": null}", "key 'text' is not a string (it is null)"},
      {"{\"text\": [\"a\"]}", "key 'text' is not a string (it is an array)"},
      {"{\"text\": {\"a\": 1}}", "key 'text' is not a string (it is an object)"},
      {"{\"text\": true}", "key 'text' is not a string (it is a boolean)"},
      {"{\"text\": \"bad \xff byte\"}", "invalid UTF-8"},
  };
  int index = 0;
  for (const BadCase& bad : cases) {
    const std::string path =
        write("bad" + std::to_string(index++) + ".jsonl", "{\"text\": \"good 1\"}\n\n" + bad.line + "\n{\"text\": \"good 2\"}\n");
    const std::string prefix = path + ":3: " + bad.what;

    DocumentReader strict({path}, {});
    Document doc;
    ASSERT_TRUE(strict.next(&doc));
    EXPECT_EQ(doc.fields[0], "good 1");
    const std::string message = error_of([&] { strict.next(&doc); });
    EXPECT_EQ(message.substr(0, prefix.size()), prefix) << bad.line;

    ReaderOptions skip;
    skip.skip_bad_records = true;
    DocumentReader lenient({path}, skip);
    EXPECT_EQ(read_all_docs(lenient), (std::vector<Doc>{{{"good 1"}, path, 1}, {{"good 2"}, path, 4}})) << bad.line;
    EXPECT_EQ(lenient.bad_records(), 1u);
    ASSERT_EQ(lenient.reported_errors().size(), 1u);
    EXPECT_EQ(lenient.reported_errors()[0].substr(0, prefix.size()), prefix);
  }
}

TEST_F(DocumentReaderTest, MalformedJsonCarriesTheParserMessage) {
  const std::string path = write("m.jsonl", "{\"text\": }\n");
  const std::string message = error_of([&] { read_all_docs({path}); });
  const std::string prefix = path + ":1: malformed JSON (";
  EXPECT_EQ(message.substr(0, prefix.size()), prefix);
  EXPECT_GT(message.size(), prefix.size() + 10) << "the parser's explanation is missing";
  EXPECT_EQ(message.back(), ')');
}

TEST_F(DocumentReaderTest, SecondKeyMissing) {
  const std::string path = write("k.jsonl", "{\"text\": \"a\", \"title\": \"b\"}\n{\"text\": \"a\"}\n");
  ReaderOptions options;
  options.json_keys = {"text", "title"};
  EXPECT_EQ(error_of([&] { read_all_docs({path}, options); }), path + ":2: missing key 'title'");
}

TEST_F(DocumentReaderTest, InvalidUtf8InTxt) {
  const std::string path = write("u.txt", "fine\nbad \xc3\x28 pair\ntruncated \xe2\x82\nok\n");
  EXPECT_EQ(error_of([&] { read_all_docs({path}); }), path + ":2: invalid UTF-8");
  ReaderOptions skip;
  skip.skip_bad_records = true;
  DocumentReader reader({path}, skip);
  EXPECT_EQ(read_all_docs(reader), (std::vector<Doc>{{{"fine"}, path, 1}, {{"ok"}, path, 4}}));
  EXPECT_EQ(reader.bad_records(), 2u);
  EXPECT_EQ(reader.reported_errors(), (std::vector<std::string>{path + ":2: invalid UTF-8", path + ":3: invalid UTF-8"}));

  ReaderOptions whole = skip;
  whole.txt_document = TxtDocument::kFile;
  DocumentReader file_reader({path}, whole);
  EXPECT_TRUE(read_all_docs(file_reader).empty());
  EXPECT_EQ(file_reader.reported_errors(), (std::vector<std::string>{path + ": invalid UTF-8"}));
}

// Issue 26: a txt file still being written ends in a line cut short, which a reader
// would keep as a document (and fail on as malformed JSON in jsonl). A file whose
// size changed while it was read is refused at its end, before that line is handed
// out, whole or as the byte range of a divided job. The first read takes the whole
// small file, so the change lands between it and the read that finds the end.
TEST_F(DocumentReaderTest, AFileThatChangesWhileItIsReadIsRefusedAtItsEnd) {
  const std::string path = dir_.file("growing.txt");
  const std::string changed = "'" + path + "' changed while it was read (";
  const std::vector<InputRange> whole = {InputRange{.path = path}};
  const std::vector<InputRange> range = {InputRange{.path = path, .whole = false, .begin = 0, .end = 16}};
  for (const std::vector<InputRange>* inputs : {&whole, &range}) {
    write("growing.txt", "first\nsecond\ntor");
    DocumentReader reader(*inputs, {});
    Document doc;
    ASSERT_TRUE(reader.next(&doc));
    EXPECT_EQ(doc.fields[0], "first");
    std::ofstream(path, std::ios::app) << "n line\n";
    const std::string message = error_of([&] {
      while (reader.next(&doc)) EXPECT_NE(doc.fields[0], "tor") << "the line cut short became a document";
    });
    EXPECT_EQ(message, changed + "16 bytes when opened, 23 now): its last line may be cut short; HINT: preprocess "
                                 "a file once it is written completely");
  }
  write("growing.txt", "first\nsecond\nthird\n");
  DocumentReader shrinking({path}, {});
  Document doc;
  ASSERT_TRUE(shrinking.next(&doc));
  fs::resize_file(path, 3);
  EXPECT_EQ(error_of([&] { read_all_docs(shrinking); }).rfind(changed + "19 bytes when opened, 3 now)", 0), 0u);
}

// Where a document came from, for messages after reading (a tokenizer failing on it):
// the line in the file, also for a byte range that starts inside it.
TEST_F(DocumentReaderTest, PlaceNamesTheLineInTheFile) {
  const std::string path = write("lines.txt", "one\ntwo\nthree\nfour\nfive\n");
  const std::string whole_file = write("whole.txt", "all of it\n");
  // The range from byte 6 owns the lines that start at or after it: three, four, five.
  DocumentReader reader({InputRange{.path = path, .whole = false, .begin = 6, .end = 22}, InputRange{.path = path}},
                        {});
  std::vector<std::string> places;
  Document doc;
  while (reader.next(&doc)) places.push_back(doc.fields[0] + " " + reader.place(doc.input, doc.input_line));
  EXPECT_EQ(places, (std::vector<std::string>{"three " + path + ":3", "four " + path + ":4", "five " + path + ":5",
                                              "one " + path + ":1", "two " + path + ":2", "three " + path + ":3",
                                              "four " + path + ":4", "five " + path + ":5"}));
  ReaderOptions files;
  files.txt_document = TxtDocument::kFile;
  DocumentReader file_reader({whole_file}, files);
  ASSERT_TRUE(file_reader.next(&doc));
  EXPECT_EQ(file_reader.place(doc.input, doc.input_line), whole_file);
}

TEST_F(DocumentReaderTest, ReportedErrorsAreCapped) {
  std::string jsonl;
  for (int i = 0; i < 25; ++i) jsonl += "{\"text\": 1}\n{\"text\": \"ok\"}\n";
  const std::string path = write("many.jsonl", jsonl);
  ReaderOptions options;
  options.skip_bad_records = true;
  options.max_reported_errors = 3;
  DocumentReader reader({path}, options);
  EXPECT_EQ(read_all_docs(reader).size(), 25u);
  EXPECT_EQ(reader.bad_records(), 25u);
  EXPECT_EQ(reader.reported_errors(),
            (std::vector<std::string>{path + ":1: key 'text' is not a string (it is a number)",
                                      path + ":3: key 'text' is not a string (it is a number)",
                                      path + ":5: key 'text' is not a string (it is a number)"}));
}

TEST_F(DocumentReaderTest, DamagedInputsThrowEvenWhenSkipping) {
  ReaderOptions skip;
  skip.skip_bad_records = true;
  const std::string missing = dir_.file("missing.jsonl");
  EXPECT_EQ(error_of([&] { read_all_docs({missing}, skip); }),
            "cannot open '" + missing + "': No such file or directory");

  const std::string jsonl = make_jsonl(20000);
  const std::string zst = zstd_bytes(jsonl);
  const std::string cut_zst = write("cut.jsonl.zst", zst.substr(0, zst.size() / 2));
  EXPECT_EQ(error_of([&] { read_all_docs({cut_zst}, skip); }), "truncated zstd stream in '" + cut_zst + "'");
  const std::string gz = gzip_bytes(jsonl);
  const std::string cut_gz = write("cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  EXPECT_EQ(error_of([&] { read_all_docs({cut_gz}, skip); }), "truncated gzip stream in '" + cut_gz + "'");
  std::string damaged = gz;
  for (std::size_t i = damaged.size() / 2; i < damaged.size() / 2 + 32; ++i) damaged[i] = static_cast<char>(~damaged[i]);
  const std::string bad_gz = write("bad.jsonl.gz", damaged);
  const std::string message = error_of([&] { read_all_docs({bad_gz}, skip); });
  EXPECT_EQ(message.rfind("corrupt gzip stream in '" + bad_gz + "'", 0), 0u) << message;

  const std::string fake = write("fake.jsonl.zst", "{\"text\": \"plain\"}\n");
  EXPECT_EQ(error_of([&] { read_all_docs({fake}, skip); }), "'" + fake + "' is named .zst but is not zstd data");
}

TEST_F(DocumentReaderTest, SeveralInputsInOrderWithByteCounts) {
  const std::string a = write("a.txt", "a1\na2\n");
  const std::string b_content = make_jsonl(3000);
  const std::string b_zst = zstd_bytes(b_content);
  const std::string b = write("b.jsonl.zst", b_zst);
  const std::string c = write("c.jsonl", "{\"text\": \"c1\"}");

  DocumentReader reader({a, b, c}, {});
  const std::uint64_t total = 6 + b_zst.size() + 14;
  EXPECT_EQ(reader.total_input_bytes(), total);
  EXPECT_EQ(reader.raw_bytes_read(), 0u);
  Document doc;
  ASSERT_TRUE(reader.next(&doc));
  EXPECT_EQ(doc.fields[0], "a1");
  EXPECT_EQ(reader.raw_bytes_read(), 6u);
  const std::vector<Doc> rest = read_all_docs(reader);
  ASSERT_EQ(rest.size(), 1u + 3000u + 1u);
  EXPECT_EQ(rest.front(), (Doc{{"a2"}, a, 2}));
  EXPECT_EQ(rest[1].source, b);
  EXPECT_EQ(rest.back(), (Doc{{"c1"}, c, 1}));
  EXPECT_EQ(reader.raw_bytes_read(), total);
  EXPECT_FALSE(reader.next(&doc));
}

TEST_F(DocumentReaderTest, GlobsExpandSortedAndMustMatch) {
  for (const char* name : {"b.jsonl", "a.jsonl", "c.txt", "a10.jsonl", "a2.jsonl"}) write(name, "");
  const std::string d = dir_.path();
  EXPECT_EQ(expand_inputs({d + "/*.jsonl", "-", d + "/c.tx?", d + "/not-there.txt"}),
            (std::vector<std::string>{d + "/a.jsonl", d + "/a10.jsonl", d + "/a2.jsonl", d + "/b.jsonl", "-",
                                      d + "/c.txt", d + "/not-there.txt"}));
  EXPECT_EQ(error_of([&] { expand_inputs({d + "/*.parquet"}); }), "no input file matches '" + d + "/*.parquet'");
  EXPECT_EQ(expand_inputs({d + "/[ab].jsonl"}), (std::vector<std::string>{d + "/a.jsonl", d + "/b.jsonl"}));
}

TEST_F(DocumentReaderTest, StdinUsesTheDefaultFormat) {
  const std::string jsonl = make_jsonl(5000);
  const std::vector<Doc> expected = read_all_docs({write("s.jsonl", jsonl)});
  std::vector<Doc> from_stdin;
  {
    StdinFromPipe stdin_pipe(zstd_bytes(jsonl));
    DocumentReader reader({"-"}, {});
    EXPECT_EQ(reader.total_input_bytes(), 0u);
    from_stdin = read_all_docs(reader);
  }
  ASSERT_EQ(from_stdin.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(from_stdin[i].fields, expected[i].fields);
    EXPECT_EQ(from_stdin[i].line, expected[i].line);
    EXPECT_EQ(from_stdin[i].source, "-");
  }
  {
    StdinFromPipe stdin_pipe("{\"text\": 1}\n");
    EXPECT_EQ(error_of([] { read_all_docs({"-"}); }), "<stdin>:1: key 'text' is not a string (it is a number)");
  }
  {
    StdinFromPipe stdin_pipe("plain text\n");
    ReaderOptions options;
    options.stdin_format = InputFormat::kTxt;
    EXPECT_EQ(read_all_docs({"-"}, options), (std::vector<Doc>{{{"plain text"}, "-", 1}}));
  }
}

}  // namespace
}  // namespace dufu::dataprep
