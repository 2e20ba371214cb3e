#include "common/file_root.h"

#include <algorithm>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace baton {
namespace {

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve ", path, ": ", std::strerror(errno)));
  }
  return std::string(buf);
}

bool Under(const std::string& path, const std::string& root) {
  return path == root || root == "/" || absl::StartsWith(path, root + "/");
}

}  // namespace

absl::StatusOr<std::string> ResolveUnderRoot(const std::string& root, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  if (path.find('\0') != std::string::npos) return absl::InvalidArgumentError("path holds a NUL byte");
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  for (const std::string& p : parts) {
    if (p == "..") {
      return absl::PermissionDeniedError(absl::StrCat("path \"", path, "\" has a \"..\" component: refused"));
    }
  }
  auto real_root = RealPath(root);
  if (!real_root.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the file root ", root, " does not exist"));
  }
  const std::string joined = path[0] == '/' ? path : absl::StrCat(*real_root, "/", path);
  // The longest prefix that exists resolves through its symlinks; the rest
  // does not exist yet (and has no "..").
  std::vector<std::string> all = absl::StrSplit(joined, '/', absl::SkipEmpty());
  size_t existing = all.size();
  std::string prefix;
  while (true) {
    prefix = "/" + absl::StrJoin(all.begin(), all.begin() + existing, "/");
    struct stat st;
    if (lstat(prefix.c_str(), &st) == 0 || existing == 0) break;
    --existing;
  }
  auto real_prefix = RealPath(prefix);
  if (!real_prefix.ok()) return real_prefix.status();
  std::string resolved = *real_prefix;
  for (size_t i = existing; i < all.size(); ++i) {
    if (all[i] == ".") continue;
    absl::StrAppend(&resolved, resolved == "/" ? "" : "/", all[i]);
  }
  if (!Under(resolved, *real_root)) {
    return absl::PermissionDeniedError(
        absl::StrCat("path \"", path, "\" resolves to ", resolved, ", outside the file root ", *real_root));
  }
  return resolved;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, const ReadFileOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (options.follow_symlinks ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", why));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > options.limit) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file of at most ", options.limit, " bytes"));
  }
  if (options.private_to_user && (st.st_uid != ::getuid() || (st.st_mode & 077) != 0)) {
    ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat(path, " must be owned by this user and readable by it alone (chmod 600",
                                                    st.st_uid != ::getuid() ? "; it belongs to another user)" : ")"));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  const int64_t done = PreadFully(fd, out.data(), static_cast<int64_t>(out.size()), 0);
  ::close(fd);
  if (done != static_cast<int64_t>(out.size())) return absl::DataLossError(absl::StrCat("cannot read all of ", path));
  return out;
}

int64_t PreadFully(int fd, void* data, int64_t n, int64_t at) {
  char* p = static_cast<char*>(data);
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, static_cast<size_t>(std::min<int64_t>(n - done, int64_t{1} << 30)),
                              static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += r;
  }
  return done;
}

absl::Status PreadAll(int fd, char* data, int64_t n, int64_t at, const std::string& path) {
  const int64_t r = PreadFully(fd, data, n, at);
  if (r < 0) return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  if (r < n) return absl::DataLossError(absl::StrCat(path, " is shorter than its checkpoint metadata says"));
  return absl::OkStatus();
}

std::vector<std::string> DirectoryEntries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status MakeDirs(const std::string& path) {
  std::string at;
  for (const auto& part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    absl::StrAppend(&at, "/", part);
    if (mkdir(at.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat("cannot create directory ", at, ": ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const char* data, int64_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      return absl::Status(e == ENOSPC || e == EDQUOT ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal,
                          absl::StrCat("cannot write ", path, ": ", std::strerror(e)));
    }
    data += w;
    n -= w;
  }
  return absl::OkStatus();
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

absl::Status WriteFileDurably(const std::string& path, const std::string& bytes, int mode) {
  return WriteFileDurably(
      path, [&](int fd, const std::string& tmp) { return WriteAll(fd, bytes.data(), static_cast<int64_t>(bytes.size()), tmp); },
      mode);
}

absl::Status WriteFileDurably(const std::string& path,
                              const std::function<absl::Status(int fd, const std::string& tmp)>& write, int mode) {
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  absl::Status s = write(fd, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = absl::InternalError(absl::StrCat("cannot fsync ", tmp, ": ", std::strerror(errno)));
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const size_t slash = path.rfind('/');
  SyncDirectory(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
  return absl::OkStatus();
}

absl::Status CheckWritableDirectory(const std::string& dir) {
  if (auto s = MakeDirs(dir); !s.ok()) return s;
  const std::string probe = absl::StrCat(dir, "/.baton-probe-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create files in ", dir, ": ", std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

std::string RootOrWorkingDirectory(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  char buf[PATH_MAX];
  return getcwd(buf, sizeof(buf)) != nullptr ? std::string(buf) : std::string("/nonexistent");
}

}  // namespace baton
