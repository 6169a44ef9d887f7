// PCRE2 behind RegexSplitter. Patterns are compiled once (with the JIT when the
// platform has it) and shared; each thread matches with its own match data.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex_splitter.h"

#include <pcre2.h>

#include "dufu/common/error.h"
#include "dufu/common/utf8.h"

namespace dufu::dataprep {

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int error) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(error, buffer, sizeof buffer) < 0) return str_cat("PCRE2 error ", error);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

RegexSplitter::RegexSplitter(std::string pattern, RegexDialect dialect, bool literal)
    : pattern_(std::move(pattern)), dialect_(dialect), code_(std::make_unique<Code>()) {
  std::uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  if (literal) {
    // PCRE2 refuses PCRE2_LITERAL with the options below, which a literal needs not.
    options |= PCRE2_LITERAL;
  } else {
    // Rust's regex: `$` only at the end of the text. Oniguruma's Ruby syntax: `^`/`$`
    // at line boundaries.
    options |= PCRE2_UCP | (dialect == RegexDialect::kTiktoken ? PCRE2_DOLLAR_ENDONLY : PCRE2_MULTILINE);
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), options,
                              &error, &offset, nullptr);
  if (code_->code == nullptr) {
    DUFU_FAIL("cannot compile the pre-tokenizer pattern '", pattern_, "': ", pcre2_message(error),
              " at offset ", offset);
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() = default;

struct RegexSplitter::Matcher::State {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~State() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

RegexSplitter::Matcher::Matcher(const RegexSplitter& splitter)
    : splitter_(splitter), state_(std::make_unique<State>()) {
  state_->match_data = pcre2_match_data_create_from_pattern(splitter.code_->code, nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  if (state_->match_data == nullptr || state_->context == nullptr) throw std::bad_alloc();
  if (splitter.code_->jit) {
    // Long runs of whitespace backtrack through (?!\S): give the JIT room for them.
    state_->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (state_->jit_stack == nullptr) throw std::bad_alloc();
    pcre2_jit_stack_assign(state_->context, nullptr, state_->jit_stack);
  }
}

RegexSplitter::Matcher::~Matcher() = default;

bool RegexSplitter::Matcher::find(std::string_view text, std::size_t start, std::size_t previous_end,
                                  std::size_t* begin, std::size_t* end) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (start <= text.size()) {
    const int result =
        splitter_.code_->jit
            ? pcre2_jit_match(splitter_.code_->code, subject, text.size(), start, 0, state_->match_data,
                              state_->context)
            : pcre2_match(splitter_.code_->code, subject, text.size(), start, 0, state_->match_data,
                          state_->context);
    if (result == PCRE2_ERROR_NOMATCH) return false;
    if (result < 0) {
      DUFU_FAIL("pre-tokenizer pattern '", splitter_.pattern_, "' failed to match: ", pcre2_message(result));
    }
    const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(state_->match_data);
    const bool empty_splits = splitter_.dialect_ == RegexDialect::kHuggingFace && vector[0] != previous_end;
    if (vector[1] > vector[0] || empty_splits) {
      *begin = vector[0];
      *end = vector[1];
      return true;
    }
    // Go on one character later, or one byte past a byte of an ill-formed sequence.
    if (vector[0] >= text.size()) return false;
    const Utf8Sequence sequence = utf8_sequence(text, vector[0]);
    start = vector[0] + (sequence.valid ? sequence.length : 1);
  }
  return false;
}

bool RegexSplitter::Matcher::emit_gap(std::string_view gap) const {
  return splitter_.keeps_gaps() || !is_valid_utf8(gap);
}

}  // namespace dufu::dataprep
