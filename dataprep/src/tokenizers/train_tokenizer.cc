// Trains a sentencepiece model from dufu's readers. sentencepiece treats each input
// line as a sentence, so documents are split on newlines the way spm_train would see
// them in a text file; compressed and jsonl inputs need no unpacking first.
#include "dufu/dataprep/train_tokenizer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <thread>
#include <unordered_map>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

// Feeds non-empty lines of every document field to sentencepiece. Reader errors are
// kept and reported after training instead of unwinding through sentencepiece.
class DocumentSentences : public sentencepiece::SentenceIterator {
 public:
  explicit DocumentSentences(DocumentReader& reader) : reader_(reader) { Next(); }

  bool done() const override { return done_; }
  const std::string& value() const override { return sentence_; }
  sentencepiece::util::Status status() const override {
    if (error_) return sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, "input error");
    return sentencepiece::util::Status();
  }
  void Next() override {
    try {
      while (!take_line()) {
        if (!reader_.next(&document_)) {
          done_ = true;
          return;
        }
        ++documents_;
        field_ = 0;
        position_ = 0;
      }
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }

  std::exception_ptr error() const { return error_; }
  std::uint64_t documents() const { return documents_; }
  std::uint64_t sentences() const { return sentences_; }

 private:
  // Moves to the next non-empty line of the current document; false when it has none.
  bool take_line() {
    while (field_ < document_.fields.size()) {
      const std::string& text = document_.fields[field_];
      while (position_ < text.size()) {
        auto end = text.find('\n', position_);
        if (end == std::string::npos) end = text.size();
        const auto begin = position_;
        position_ = end + 1;
        auto length = end - begin;
        if (length > 0 && text[begin + length - 1] == '\r') --length;
        if (length > 0) {
          sentence_.assign(text, begin, length);
          ++sentences_;
          return true;
        }
      }
      ++field_;
      position_ = 0;
    }
    return false;
  }

  DocumentReader& reader_;
  Document document_;
  std::size_t field_ = 0;
  std::size_t position_ = 0;
  std::string sentence_;
  bool done_ = false;
  std::exception_ptr error_;
  std::uint64_t documents_ = 0;
  std::uint64_t sentences_ = 0;
};

void rename_or_fail(const std::string& from, const std::string& to) {
  // sentencepiece wrote the file without syncing it: make it durable before its name.
  const int fd = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    const int error = errno;
    std::remove(from.c_str());
    DUFU_FAIL("cannot rename '", from, "' to '", to, "': ", errno_message(error));
  }
}

// Removes ".NAME.tmp.PID.model" and ".vocab" left in `directory` by training runs
// whose process is gone (SIGKILL): their pid is in the name.
void remove_dead_temporaries(const std::filesystem::path& directory, const std::string& name) {
  const std::string head = "." + name + ".tmp.";
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.compare(0, head.size(), head) != 0) continue;
    const std::string rest = file.substr(head.size());
    const auto dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || rest.find_first_not_of("0123456789") != dot) continue;
    const std::string suffix = rest.substr(dot);
    if (suffix != ".model" && suffix != ".vocab") continue;
    const int pid = std::stoi(rest.substr(0, std::min<std::size_t>(dot, 9)));
    if (pid == ::getpid() || !process_exists(pid)) ::unlink((directory / file).c_str());
  }
  ::closedir(dir);
}

}  // namespace

TrainTokenizerStats train_tokenizer(const TrainTokenizerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.inputs.empty()) DUFU_FAIL("no input files given");
  if (options.model_prefix.empty()) DUFU_FAIL("no model prefix given");
  if (options.vocab_size <= 0) DUFU_FAIL("vocab size must be positive, got ", options.vocab_size);

  // sentencepiece writes PREFIX.model and PREFIX.vocab itself; train under a
  // temporary prefix in the same directory and rename, so a failed run leaves no
  // model under the final names.
  const std::filesystem::path final_prefix(options.model_prefix);
  const auto directory = final_prefix.has_parent_path() ? final_prefix.parent_path()
                                                       : std::filesystem::path(".");
  const std::string temp_prefix =
      (directory / ("." + final_prefix.filename().string() + ".tmp." + std::to_string(::getpid())))
          .string();
  remove_dead_temporaries(directory, final_prefix.filename().string());

  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  std::unordered_map<std::string, std::string> arguments = {
      {"model_prefix", temp_prefix},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"model_type", options.model_type},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"input_sentence_size", std::to_string(options.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(options.max_sentence_length)},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "1"},
  };
  for (const auto& extra : options.extra_args) {
    auto flag = extra;
    while (!flag.empty() && flag.front() == '-') flag.erase(flag.begin());
    const auto equals = flag.find('=');
    if (equals == std::string::npos || equals == 0) {
      DUFU_FAIL("sentencepiece option '", extra, "' must look like --name=value");
    }
    arguments[flag.substr(0, equals)] = flag.substr(equals + 1);
  }

  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(options.seed));
  DocumentReader reader(expand_inputs(options.inputs), options.reader);
  DocumentSentences sentences(reader);
  const std::string temp_model = temp_prefix + ".model";
  const std::string temp_vocab = temp_prefix + ".vocab";
  // SIGINT/SIGTERM during the (long) training remove what sentencepiece wrote so far.
  struct Unregister {
    int slots[2];
    ~Unregister() {
      for (const int slot : slots) unregister_cleanup_path(slot);
    }
  } const cleanup{{register_cleanup_path(temp_model), register_cleanup_path(temp_vocab)}};
  const auto status = sentencepiece::SentencePieceTrainer::Train(arguments, &sentences);
  if (sentences.error() || !status.ok()) {
    std::remove(temp_model.c_str());
    std::remove(temp_vocab.c_str());
    if (sentences.error()) std::rethrow_exception(sentences.error());
    DUFU_FAIL("sentencepiece training failed: ", status.ToString());
  }

  TrainTokenizerStats stats;
  stats.model_path = options.model_prefix + ".model";
  stats.vocab_path = options.model_prefix + ".vocab";
  rename_or_fail(temp_vocab, stats.vocab_path);
  rename_or_fail(temp_model, stats.model_path);
  stats.documents = sentences.documents();
  stats.sentences = sentences.sentences();
  stats.input_bytes = reader.raw_bytes_read();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace dufu::dataprep
