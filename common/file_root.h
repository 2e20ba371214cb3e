// Confining file access to a root the operator configures: checkpoint and
// data paths that arrive in requests resolve under it, and nothing else.
//
// A relative path is taken relative to the root; an absolute one must lie
// under it. Refused before anything is opened: an empty path, any ".."
// component, and a path whose existing part resolves (through symlinks)
// outside the root.
#ifndef BATON_COMMON_FILE_ROOT_H_
#define BATON_COMMON_FILE_ROOT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

// The canonical path `path` names under `root` (which must exist);
// PERMISSION_DENIED naming the path when it leaves the root.
absl::StatusOr<std::string> ResolveUnderRoot(const std::string& root, const std::string& path);

// The whole of a small regular file (metadata, a token, a certificate):
// opened non-blocking (a FIFO cannot hang it), refused unless it is a regular
// file of at most `limit` bytes; with `private_to_user`, also unless this
// user owns it and nobody else may read it (a secret). NOT_FOUND when it does
// not exist. Errors name the path, never its contents.
struct ReadFileOptions {
  int64_t limit = 1 << 20;
  bool follow_symlinks = true;
  bool private_to_user = false;
};
// Reads up to `n` bytes at offset `at` of `fd` into `data`, through short
// reads and EINTR: the bytes read (fewer than `n` only at the end of the
// file), or -1 with errno set.
int64_t PreadFully(int fd, void* data, int64_t n, int64_t at);
// All `n` bytes at `at`, or an error naming `path`: DATA_LOSS when the file
// is shorter (its metadata promised more).
absl::Status PreadAll(int fd, char* data, int64_t n, int64_t at, const std::string& path);

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, const ReadFileOptions& options);

// mkdir -p (mode 0755).
absl::Status MakeDirs(const std::string& path);
// The names in directory `dir`, sorted, without "." and ".."; none when it
// cannot be read.
std::vector<std::string> DirectoryEntries(const std::string& dir);

// Writes all of `n` bytes to `fd` through short writes and EINTR; an error
// naming `path` (and errno: a full disk says so) otherwise.
absl::Status WriteAll(int fd, const char* data, int64_t n, const std::string& path);
// fsync of a directory (its entries: a rename or a new file in it).
void SyncDirectory(const std::string& dir);
// Replaces `path` with `bytes` so that a reader - or a process started after
// a crash - sees the old file or the new one, never a part: a temporary name
// beside it, fsync, rename, fsync of the directory. The temporary file is
// removed when any step fails.
absl::Status WriteFileDurably(const std::string& path, const std::string& bytes, int mode = 0644);
// The same, the bytes streamed by `write` into the temporary file (`fd`,
// named `tmp` for errors): a file too large to hold in memory.
absl::Status WriteFileDurably(const std::string& path,
                              const std::function<absl::Status(int fd, const std::string& tmp)>& write,
                              int mode = 0644);
// Whether files can be created in directory `dir` (made if missing): a
// probe file is created and removed. The error names the path.
absl::Status CheckWritableDirectory(const std::string& dir);

// The directory a daemon's `--checkpoint_root` flag means: the flag's value,
// or the working directory when it is empty.
std::string RootOrWorkingDirectory(const std::string& flag_value);

}  // namespace baton

#endif  // BATON_COMMON_FILE_ROOT_H_
