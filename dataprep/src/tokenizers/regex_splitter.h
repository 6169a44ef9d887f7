// Pre-tokenization by regex: PCRE2 (UTF, Unicode properties, JIT) splitting text into
// the pieces that byte-level BPE encodes one by one. Two dialects, for the two
// reference implementations whose patterns dufu runs:
//   - kTiktoken (Rust regex / fancy-regex): `$` is the end of the text; text between
//     matches is dropped, as tiktoken's find_iter drops it (its patterns leave none).
//   - kHuggingFace (Oniguruma, Ruby syntax): `^` and `$` are line anchors; text
//     between matches is a piece too (the Split pre-tokenizer's Isolated behaviour),
//     and with `matches_are_pieces` false only that text is (Removed). An empty match
//     splits the text there, except right where the previous match ended (the rule
//     of the onig crate's find_iter): an empty pattern cuts every character apart.
// Bytes that are not valid UTF-8 never match; they always come out as pieces of their
// own, so no byte is lost.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace dufu::dataprep {

enum class RegexDialect { kTiktoken, kHuggingFace };

class RegexSplitter {
 public:
  // Throws dufu::Error with PCRE2's message and the offset in the pattern.
  RegexSplitter(std::string pattern, RegexDialect dialect, bool literal = false);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  const std::string& pattern() const { return pattern_; }
  RegexDialect dialect() const { return dialect_; }
  bool keeps_gaps() const { return dialect_ == RegexDialect::kHuggingFace; }

  // Per-thread match state (PCRE2 match data and JIT stack).
  class Matcher {
   public:
    explicit Matcher(const RegexSplitter& splitter);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // Calls piece(std::string_view) for every piece of `text`, in order.
    template <typename Piece>
    void split(std::string_view text, Piece&& piece, bool matches_are_pieces = true);

   private:
    // The first match at or after `start`: true and [*begin, *end). Empty matches
    // are skipped, except in kHuggingFace where only one ending at `previous_end`
    // (the end of the match before) is.
    bool find(std::string_view text, std::size_t start, std::size_t previous_end, std::size_t* begin,
              std::size_t* end);
    // Whether the gap [begin, end) between matches is emitted.
    bool emit_gap(std::string_view gap) const;

    const RegexSplitter& splitter_;
    struct State;
    std::unique_ptr<State> state_;
  };

 private:
  friend class Matcher;
  std::string pattern_;
  RegexDialect dialect_;
  struct Code;
  std::unique_ptr<Code> code_;
};

template <typename Piece>
void RegexSplitter::Matcher::split(std::string_view text, Piece&& piece, bool matches_are_pieces) {
  std::size_t done = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t previous_end = std::string_view::npos;
  while (done < text.size() && find(text, done, previous_end, &begin, &end)) {
    if (begin > done && emit_gap(text.substr(done, begin - done))) piece(text.substr(done, begin - done));
    if (matches_are_pieces && end > begin) piece(text.substr(begin, end - begin));
    done = previous_end = end;
  }
  if (done < text.size() && emit_gap(text.substr(done))) piece(text.substr(done));
}

}  // namespace dufu::dataprep
