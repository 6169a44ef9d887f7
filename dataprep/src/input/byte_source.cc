// Opens one input (a file or stdin) as a stream of bytes. Compression is chosen from
// the magic bytes rather than the name, so piped zstd/gzip data works; the name is
// only cross-checked so that a mislabelled file fails loudly instead of being read as
// garbage text. Memory stays bounded: one fixed block per source plus the decoder.
#include "dufu/dataprep/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string_view>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

// Large enough that syscall and decoder-call overhead vanish per byte, small enough
// that several readers side by side stay cheap.
constexpr std::size_t kBlockSize = std::size_t{1} << 20;

// Owns a descriptor; stdin is borrowed, never closed, so the caller can reuse it.
class Fd {
 public:
  Fd(int fd, bool owned) : fd_(fd), owned_(owned) {}
  Fd(Fd&& other) noexcept : fd_(other.fd_), owned_(other.owned_) { other.owned_ = false; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (owned_) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
  bool owned_;
};

std::size_t read_fd(int fd, const std::string& name, char* out, std::size_t capacity) {
  for (;;) {
    const ssize_t n = ::read(fd, out, capacity);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) DUFU_FAIL("error reading '", name, "': ", errno_message(errno));
  }
}

// The common part of every source: the descriptor, the raw-byte count and one input
// block that initially holds the bytes already read to sniff the magic.
class FileSource : public ByteSource {
 public:
  FileSource(std::string name, Fd fd, std::unique_ptr<char[]> block, std::size_t sniffed, FileSnapshot opened)
      : ByteSource(std::move(name)),
        fd_(std::move(fd)),
        block_(std::move(block)),
        sniffed_(sniffed),
        opened_(opened),
        raw_bytes_(sniffed) {}

  std::uint64_t raw_bytes_read() const override { return raw_bytes_; }

 protected:
  std::size_t read_raw(char* out, std::size_t capacity) {
    const std::size_t n = read_fd(fd_.get(), name(), out, capacity);
    raw_bytes_ += n;
    // Before the end is reported (and a last line without '\n' is taken whole).
    if (n == 0 && capacity > 0) check_unchanged(fd_.get(), opened_, name());
    return n;
  }

  Fd fd_;
  std::unique_ptr<char[]> block_;
  std::size_t sniffed_;

 private:
  FileSnapshot opened_;
  std::uint64_t raw_bytes_;
};

class PlainSource final : public FileSource {
 public:
  using FileSource::FileSource;

  std::size_t read(char* out, std::size_t capacity) override {
    if (capacity == 0) return 0;
    if (block_) {
      const std::size_t n = std::min(capacity, sniffed_ - consumed_);
      std::memcpy(out, block_.get() + consumed_, n);
      consumed_ += n;
      if (consumed_ == sniffed_) block_.reset();  // not needed any more
      if (n > 0) return n;
    }
    // Straight into the caller's buffer: plain input costs no extra copy.
    return read_raw(out, capacity);
  }
  Compression compression() const override { return Compression::kNone; }

 private:
  std::size_t consumed_ = 0;
};

class ZstdSource final : public FileSource {
 public:
  ZstdSource(std::string name, Fd fd, std::unique_ptr<char[]> block, std::size_t sniffed, FileSnapshot opened)
      : FileSource(std::move(name), std::move(fd), std::move(block), sniffed, opened),
        dctx_(ZSTD_createDCtx()),
        input_{block_.get(), sniffed_, 0} {
    if (!dctx_) DUFU_FAIL("out of memory creating a zstd decoder for '", this->name(), "'");
  }

  std::size_t read(char* out, std::size_t capacity) override {
    if (capacity == 0) return 0;
    ZSTD_outBuffer output{out, capacity, 0};
    while (output.pos == 0) {
      // A full output buffer may leave decoded bytes inside the decoder, so it must
      // be called again before asking the file for more.
      if (input_.pos == input_.size && !may_have_output_) {
        const std::size_t n = read_raw(block_.get(), kBlockSize);
        if (n == 0) {
          // 0 means the last frame ended exactly; anything else is a frame cut short.
          if (last_result_ != 0) DUFU_FAIL("truncated zstd stream in '", name(), "'");
          return 0;
        }
        input_ = ZSTD_inBuffer{block_.get(), n, 0};
      }
      if (at_frame_start_) start_frame();
      const std::size_t input_before = input_.pos, output_before = output.pos;
      const std::size_t result = ZSTD_decompressStream(dctx_.get(), &output, &input_);
      if (ZSTD_isError(result)) {
        DUFU_FAIL("corrupt zstd stream in '", name(), "': ", ZSTD_getErrorName(result));
      }
      frame_decoded_ += output.pos - output_before;
      // A call that moved nothing says nothing about the frame: after a frame's end,
      // it reports the size of the next frame header, which is not a truncation.
      if (input_.pos != input_before || output.pos != output_before) {
        last_result_ = result;
        if (result == 0) end_frame();
      }
      may_have_output_ = output.pos == output.size;
    }
    return output.pos;
  }
  Compression compression() const override { return Compression::kZstd; }

 private:
  // The largest zstd frame header (ZSTD_FRAMEHEADERSIZE_MAX, an experimental name).
  static constexpr std::size_t kMaxFrameHeader = 18;

  // Notes the content size a frame's header declares. The streaming decoder does not
  // hold every frame to it: with a small output buffer, a frame whose last block is
  // empty ends early without an error, so a corrupt frame would read as a shorter,
  // valid one.
  void start_frame() {
    // The header may straddle two blocks: move the rest of this one to the front.
    while (input_.size - input_.pos < kMaxFrameHeader) {
      const std::size_t kept = input_.size - input_.pos;
      std::memmove(block_.get(), static_cast<const char*>(input_.src) + input_.pos, kept);
      const std::size_t n = read_raw(block_.get() + kept, kBlockSize - kept);
      input_ = ZSTD_inBuffer{block_.get(), kept + n, 0};
      if (n == 0) break;  // a short last frame: the decoder reports what is wrong
    }
    // UNKNOWN when the header does not say, ERROR when it is not a valid header
    // (the decoder refuses it); 0 for a skippable frame, which decodes to nothing.
    frame_content_size_ =
        ZSTD_getFrameContentSize(static_cast<const char*>(input_.src) + input_.pos, input_.size - input_.pos);
    frame_decoded_ = 0;
    at_frame_start_ = false;
  }

  void end_frame() {
    if (frame_content_size_ != ZSTD_CONTENTSIZE_UNKNOWN && frame_content_size_ != ZSTD_CONTENTSIZE_ERROR &&
        frame_decoded_ != frame_content_size_) {
      DUFU_FAIL("corrupt zstd stream in '", name(), "': a frame declares ", frame_content_size_,
                " bytes of content but holds ", frame_decoded_);
    }
    at_frame_start_ = true;
  }

  struct FreeDctx {
    void operator()(ZSTD_DCtx* dctx) const { ZSTD_freeDCtx(dctx); }
  };
  std::unique_ptr<ZSTD_DCtx, FreeDctx> dctx_;
  ZSTD_inBuffer input_;
  std::size_t last_result_ = 1;  // nothing decoded yet: an empty stream is truncated
  bool may_have_output_ = false;
  bool at_frame_start_ = true;
  unsigned long long frame_content_size_ = ZSTD_CONTENTSIZE_UNKNOWN;
  std::uint64_t frame_decoded_ = 0;
};

class GzipSource final : public FileSource {
 public:
  GzipSource(std::string name, Fd fd, std::unique_ptr<char[]> block, std::size_t sniffed, FileSnapshot opened)
      : FileSource(std::move(name), std::move(fd), std::move(block), sniffed, opened) {
    // 15 + 32: the largest window, and accept either a gzip or a zlib header.
    if (inflateInit2(&stream_, 15 + 32) != Z_OK) {
      DUFU_FAIL("out of memory creating a gzip decoder for '", this->name(), "'");
    }
    stream_.next_in = reinterpret_cast<Bytef*>(block_.get());
    stream_.avail_in = static_cast<uInt>(sniffed_);
  }
  ~GzipSource() override { inflateEnd(&stream_); }

  std::size_t read(char* out, std::size_t capacity) override {
    // avail_out is 32-bit; a short read is allowed by the contract.
    capacity = std::min<std::size_t>(capacity, UINT_MAX);
    if (capacity == 0) return 0;
    stream_.next_out = reinterpret_cast<Bytef*>(out);
    stream_.avail_out = static_cast<uInt>(capacity);
    while (stream_.avail_out == capacity) {
      if (stream_.avail_in == 0) {
        const std::size_t n = read_raw(block_.get(), kBlockSize);
        if (n == 0) {
          if (in_member_) DUFU_FAIL("truncated gzip stream in '", name(), "'");
          return 0;
        }
        stream_.next_in = reinterpret_cast<Bytef*>(block_.get());
        stream_.avail_in = static_cast<uInt>(n);
      }
      if (!in_member_) {
        // More bytes after a member's end: `cat a.gz b.gz` is a valid gzip file.
        inflateReset(&stream_);
        in_member_ = true;
      }
      const int result = inflate(&stream_, Z_NO_FLUSH);
      switch (result) {
        case Z_OK:
        case Z_BUF_ERROR:  // needs more input; the loop provides it
          break;
        case Z_STREAM_END:
          in_member_ = false;
          break;
        case Z_NEED_DICT:
        case Z_DATA_ERROR:
          DUFU_FAIL("corrupt gzip stream in '", name(),
                    "': ", stream_.msg ? stream_.msg : "needs a preset dictionary");
        case Z_MEM_ERROR:
          DUFU_FAIL("out of memory decompressing '", name(), "'");
        default:
          DUFU_FAIL("gzip decoder failed on '", name(), "' (zlib error ", result, ")");
      }
    }
    return capacity - stream_.avail_out;
  }
  Compression compression() const override { return Compression::kGzip; }

 private:
  z_stream stream_{};
  bool in_member_ = true;
};

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

Compression sniff(const unsigned char* bytes, std::size_t size) {
  if (size >= 4 && bytes[0] == 0x28 && bytes[1] == 0xB5 && bytes[2] == 0x2F && bytes[3] == 0xFD) {
    return Compression::kZstd;
  }
  // A zstd skippable frame (magic 0x184D2A50..5F, little-endian) may open a stream.
  if (size >= 4 && (bytes[0] & 0xF0) == 0x50 && bytes[1] == 0x2A && bytes[2] == 0x4D &&
      bytes[3] == 0x18) {
    return Compression::kZstd;
  }
  if (size >= 2 && bytes[0] == 0x1F && bytes[1] == 0x8B) return Compression::kGzip;
  return Compression::kNone;
}

}  // namespace

FileSnapshot FileSnapshot::of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return {};
  return {true, static_cast<std::uint64_t>(st.st_size),
          static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

void check_unchanged(int fd, const FileSnapshot& opened, const std::string& name) {
  if (!opened.regular) return;
  const FileSnapshot now = FileSnapshot::of(fd);
  if (now.bytes == opened.bytes && now.mtime_ns == opened.mtime_ns) return;
  DUFU_FAIL("'", name, "' changed while it was read (",
            now.bytes != opened.bytes ? str_cat(opened.bytes, " bytes when opened, ", now.bytes, " now")
                                      : std::string("modified after it was opened"),
            "): its last line may be cut short; HINT: preprocess a file once it is written completely");
}

std::unique_ptr<ByteSource> open_byte_source(const std::string& path) {
  const bool is_stdin = path == "-";
  std::string name = is_stdin ? std::string("<stdin>") : path;
  const int raw_fd = is_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw_fd < 0) DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
  Fd fd(raw_fd, !is_stdin);

  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) DUFU_FAIL("cannot open '", name, "': ", errno_message(errno));
  if (S_ISDIR(st.st_mode)) DUFU_FAIL("cannot open '", name, "': ", errno_message(EISDIR));
  if (S_ISREG(st.st_mode)) {
    // Only a hint: failure merely costs read-ahead.
    (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  const FileSnapshot opened = FileSnapshot::of(fd.get());

  // A pipe may deliver fewer bytes than the magic needs in one read.
  std::unique_ptr<char[]> block(new char[kBlockSize]);
  std::size_t sniffed = 0;
  while (sniffed < 4) {
    const std::size_t n = read_fd(fd.get(), name, block.get() + sniffed, kBlockSize - sniffed);
    if (n == 0) break;
    sniffed += n;
  }
  const Compression compression =
      sniff(reinterpret_cast<const unsigned char*>(block.get()), sniffed);

  if (!is_stdin) {
    for (const char* suffix : {".zst", ".zstd"}) {
      if (compression != Compression::kZstd && ends_with(path, suffix)) {
        DUFU_FAIL("'", path, "' is named ", suffix, " but is not zstd data");
      }
    }
    if (compression != Compression::kGzip && ends_with(path, ".gz")) {
      DUFU_FAIL("'", path, "' is named .gz but is not gzip data");
    }
  }

  switch (compression) {
    case Compression::kZstd:
      return std::make_unique<ZstdSource>(std::move(name), std::move(fd), std::move(block), sniffed, opened);
    case Compression::kGzip:
      return std::make_unique<GzipSource>(std::move(name), std::move(fd), std::move(block), sniffed, opened);
    case Compression::kNone:
      break;
  }
  return std::make_unique<PlainSource>(std::move(name), std::move(fd), std::move(block), sniffed, opened);
}

}  // namespace dufu::dataprep
