// What dufu writes down about a tokenizer so that a shard or a checkpoint names the
// one its token ids belong to: the kind of file, each file's name, path and SHA-256,
// and the pre-tokenizer pattern of a .tiktoken file. A shard's sidecar
// (shard_sidecar.h) and a checkpoint's state.json hold one; the tools that decode or
// encode ids (`dataprep inspect`, `dataprep sample`, `train generate`,
// `train export-hf`) find the tokenizer through it, or refuse a --tokenizer whose
// contents are not the recorded ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dufu/common/json_writer.h"
#include "dufu/dataprep/tokenizer.h"

namespace dufu::dataprep {

struct TokenizerFileRecord {
  std::string file;    // the base name, e.g. "tok.model"
  std::string path;    // where it was read: absolute in a sidecar, relative to the directory in a checkpoint
  std::string sha256;  // of the contents, lower-case hex
  std::uint64_t bytes = 0;
  bool operator==(const TokenizerFileRecord&) const = default;
};

struct TokenizerRecord {
  std::string kind;  // tokenizer_kind_name(): sentencepiece, tiktoken, tokenizer.json, vocab.json
  TokenizerFileRecord model;
  std::optional<TokenizerFileRecord> merges;  // GPT-2's merges.txt of a vocab.json
  std::string pattern;                        // --tokenizer-pattern as given (empty: from the file name)
  bool operator==(const TokenizerRecord&) const = default;

  // The digest of the contents and the pattern: equal digests, same token ids. The
  // same value a divided job's part manifests carry as tokenizer_sha256.
  std::string identity_sha256() const;
  // e.g. "'/data/tok.model' (SHA-256 3f2a9c01b7d4...)", for messages.
  std::string describe() const;
};

std::string tokenizer_kind_name(TokenizerFileKind kind);

// Lower-case hex SHA-256 of a file's contents (streamed): a tokenizer file's, and a
// divided job's part .idx (part_manifest.h). Throws naming the file.
std::string sha256_of_file(const std::string& path);

// Reads and hashes the files of `spec` (the path made absolute, not resolved).
// Throws dufu::Error naming a file that cannot be read.
TokenizerRecord record_tokenizer(const TokenizerSpec& spec);

// `record` as a JSON object (keys: kind, model, merges when present, pattern), and
// back. Reading throws naming `where` and the field.
void write_tokenizer_record(JsonWriter& json, const TokenizerRecord& record);
TokenizerRecord parse_tokenizer_record(std::string_view json, const std::string& where);

// A recorded tokenizer and where its files are now.
struct RecordedTokenizer {
  TokenizerRecord record;
  std::string recorded_by;  // the file that records it, for messages ("out/corpus.dufu.json")
  std::string model_path;   // where the model file is to be read now
  std::string merges_path;  // and the merges file, when there is one
};

// The tokenizer a tool that reads ids uses, from --tokenizer (`given`, its model empty
// when the flag was not given) and what the data or checkpoint records:
//   - given and recorded: the given file, if its contents are the recorded ones
//     (merges and pattern default to the recorded ones); else throws one line naming
//     both files;
//   - only recorded: the recorded file, checked against its SHA-256 (throws naming it
//     when it is missing or changed since, with a hint to give --tokenizer);
//   - only given: the given file, as before dufu recorded tokenizers;
//   - neither: throws "<subject> records no tokenizer (<why>): give --tokenizer FILE".
TokenizerSpec choose_tokenizer(const TokenizerSpec& given, const std::optional<RecordedTokenizer>& recorded,
                               const std::string& subject, const std::string& why_none);

}  // namespace dufu::dataprep
