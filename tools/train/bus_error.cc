// The SIGBUS report (see bus_error.h). Everything below runs inside a signal handler
// that may interrupt any code (a loader thread reading a shard, malloc, a lock held):
// no allocation, no stdio, no locks; only open, read, close, write and _exit, on
// buffers on the faulting thread's stack.
#include "bus_error.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace dufu::tools {

namespace {

// A line of text built without allocating; what does not fit is cut.
class Line {
 public:
  void add(const char* text) {
    while (*text != '\0') add_char(*text++);
  }
  void add_decimal(std::uint64_t value) {
    char digits[24];
    int count = 0;
    do {
      digits[count++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    while (count > 0) add_char(digits[--count]);
  }
  void add_hex(std::uint64_t value) {
    add("0x");
    char digits[20];
    int count = 0;
    do {
      digits[count++] = "0123456789abcdef"[value % 16];
      value /= 16;
    } while (value != 0);
    while (count > 0) add_char(digits[--count]);
  }
  void write_to(int fd) const {
    std::size_t done = 0;
    while (done < size_) {
      const ssize_t written = ::write(fd, text_ + done, size_ - done);
      if (written <= 0) return;
      done += static_cast<std::size_t>(written);
    }
  }

 private:
  void add_char(char c) {
    if (size_ < sizeof(text_)) text_[size_++] = c;
  }

  char text_[4608];
  std::size_t size_ = 0;
};

std::uint64_t parse_hex(const char*& p) {
  std::uint64_t value = 0;
  for (;; ++p) {
    const char c = *p;
    if (c >= '0' && c <= '9') {
      value = value * 16 + static_cast<std::uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      value = value * 16 + static_cast<std::uint64_t>(c - 'a' + 10);
    } else {
      return value;
    }
  }
}

void skip_field(const char*& p) {
  while (*p != '\0' && *p != ' ') ++p;
  while (*p == ' ') ++p;
}

// One line of /proc/self/maps: "start-end perms offset dev inode   path". When the
// range holds `address` and maps a file, points `path` at the file's name and sets
// `offset` to the file offset of the address.
bool match_mapping(const char* line, std::uintptr_t address, const char*& path, std::uint64_t& offset) {
  const char* p = line;
  const std::uint64_t start = parse_hex(p);
  if (*p != '-') return false;
  ++p;
  const std::uint64_t end = parse_hex(p);
  if (address < start || address >= end) return false;
  skip_field(p);  // the range
  skip_field(p);  // the permissions
  const std::uint64_t file_offset = parse_hex(p);
  skip_field(p);  // the offset
  skip_field(p);  // the device
  skip_field(p);  // the inode
  if (*p != '/') return false;  // anonymous memory, the stack, [heap], ...
  path = p;
  offset = file_offset + (address - start);
  return true;
}

// Finds the mapping of `address` in /proc/self/maps; its line is kept in `line`.
bool find_mapping(std::uintptr_t address, char (&line)[4352], const char*& path, std::uint64_t& offset) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char chunk[2048];
  std::size_t size = 0;
  bool found = false;
  for (ssize_t count; !found && (count = ::read(fd, chunk, sizeof(chunk))) > 0;) {
    for (ssize_t i = 0; i < count && !found; ++i) {
      if (chunk[i] != '\n') {
        if (size + 1 < sizeof(line)) line[size++] = chunk[i];
        continue;
      }
      line[size] = '\0';
      found = match_mapping(line, address, path, offset);
      size = 0;
    }
  }
  ::close(fd);
  return found;
}

extern "C" void report_bus_error(int /*signal_number*/, siginfo_t* info, void* /*context*/) {
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  char line[4352];
  const char* path = nullptr;
  std::uint64_t offset = 0;
  Line message;
  message.add("train: error: ");
  if (find_mapping(address, line, path, offset)) {
    message.add(path);
    message.add(": reading byte ");
    message.add_decimal(offset);
    message.add(" of this memory-mapped file failed (SIGBUS): it is shorter than when it was opened, "
                "truncated while in use; HINT: a file must not change while train reads it: restore it and "
                "resume from the last checkpoint\n");
  } else {
    message.add("bus error (SIGBUS) reading address ");
    message.add_hex(address);
    message.add(", which is in no mapped file\n");
  }
  message.write_to(STDERR_FILENO);
  ::_exit(1);
}

}  // namespace

void report_bus_errors() {
  struct sigaction action {};
  action.sa_sigaction = report_bus_error;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, nullptr);
}

}  // namespace dufu::tools
