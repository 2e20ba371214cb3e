#include "client/local_cluster.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/file_root.h"
#include "common/security.h"

namespace baton {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string path(buf);
  return path.substr(0, path.rfind('/'));
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return "stopped";
}

// Reads a one-line file written atomically by a child once it serves.
absl::StatusOr<std::string> AwaitAddressFile(const std::string& path, pid_t pid,
                                             const std::string& name, absl::Time deadline) {
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return absl::InternalError(absl::StrCat(name, " ", DescribeExit(status), " before serving"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " did not start serving in time"));
}

// rm -r, for the cluster's own state directory.
void RemoveTree(const std::string& dir) {
  nftw(dir.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

// The directories of earlier `baton up`s that were killed before they could
// remove them (SIGKILL): their tokens (secrets), address and own job table.
// Each names its owner in owner.pid; one whose owner is gone is removed. A
// pid taken again by another process keeps its directory (never one too
// many removed).
void RemoveAbandoned(const std::string& tmp) {
  std::vector<std::string> abandoned;
  for (const std::string& name : DirectoryEntries(tmp)) {
    if (name.rfind("baton-up-", 0) != 0) continue;
    const std::string dir = absl::StrCat(tmp, "/", name);
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) continue;
    std::ifstream in(dir + "/owner.pid");
    pid_t owner = 0;
    if (!(in >> owner) || owner <= 0) continue;
    if (::kill(owner, 0) != 0 && errno == ESRCH) abandoned.push_back(dir);
  }
  for (const std::string& dir : abandoned) RemoveTree(dir);
}

}  // namespace

absl::StatusOr<std::string> FindBinary(const std::string& flag_value, const std::string& package,
                                       const std::string& name) {
  if (!flag_value.empty()) {
    if (IsExecutable(flag_value)) return flag_value;
    return absl::NotFoundError(absl::StrCat(flag_value, " is not an executable file"));
  }
  const std::string dir = SelfDir();
  for (const std::string& candidate :
       {absl::StrCat(dir, "/", name), absl::StrCat(dir, "/../", package, "/", name)}) {
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", name, " next to ", dir,
                                          "; build //", package, ":", name, " or pass its path"));
}

absl::StatusOr<pid_t> LocalCluster::Spawn(const std::string& name, const std::string& binary,
                                          const std::vector<std::string>& args) {
  std::vector<std::string> argv_storage{binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed: ", strerror(errno)));
  if (pid == 0) {
    // Child: die with the parent, start with default signal handling.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  processes_.push_back({name, pid, true, 0});
  return pid;
}

absl::Status LocalCluster::WriteNewToken(const std::string& path, bool replace) {
  struct stat st;
  if (!replace && ::stat(path.c_str(), &st) == 0) return absl::OkStatus();  // the user's own token
  unsigned char bytes[24];
  const int random = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (random < 0 || ::read(random, bytes, sizeof(bytes)) != static_cast<ssize_t>(sizeof(bytes))) {
    if (random >= 0) ::close(random);
    return absl::InternalError("cannot read /dev/urandom for a token");
  }
  ::close(random);
  std::string token;
  for (unsigned char b : bytes) absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || ::write(fd, token.data(), token.size()) != static_cast<ssize_t>(token.size())) {
    if (fd >= 0) ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat("cannot write the token file ", path, ": ", strerror(errno)));
  }
  ::close(fd);
  return absl::OkStatus();
}

std::string LocalCluster::client_token() const {
  auto token = LoadToken(client_token_file_, "BATON_TOKEN_UNUSED");
  return token.ok() ? *token : "";
}

std::string LocalCluster::worker_token() const {
  auto token = LoadToken(worker_token_file_, "BATON_TOKEN_UNUSED");
  return token.ok() ? *token : "";
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& options) {
  if (options.workers < 1 || options.workers > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers ", options.workers, " outside [1, 256]"));
  }
  auto controller_bin = FindBinary(options.controller_bin, "controller", "baton-controller");
  if (!controller_bin.ok()) return controller_bin.status();
  auto worker_bin = FindBinary(options.worker_bin, "worker", "baton-worker");
  if (!worker_bin.ok()) return worker_bin.status();

  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (tmp == nullptr) tmp = std::getenv("TMPDIR");
  RemoveAbandoned(tmp ? tmp : "/tmp");
  std::string pattern = absl::StrCat(tmp ? tmp : "/tmp", "/baton-up-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp failed: ", strerror(errno)));
  }
  cluster->dir_ = pattern;
  std::ofstream(cluster->dir_ + "/owner.pid") << ::getpid() << "\n";
  const absl::Time deadline = absl::Now() + options.start_timeout;

  // A fleet of its own is closed: a fresh worker token, and the client token
  // of $BATON_TOKEN_FILE (created when missing) or a fresh one.
  cluster->worker_token_file_ = cluster->dir_ + "/worker.token";
  const char* wanted = std::getenv("BATON_TOKEN_FILE");
  cluster->client_token_file_ = wanted != nullptr && *wanted ? wanted : cluster->dir_ + "/client.token";
  if (auto s = WriteNewToken(cluster->worker_token_file_, true); !s.ok()) return s;
  if (auto s = WriteNewToken(cluster->client_token_file_, false); !s.ok()) return s;
  const std::string controller_file = cluster->dir_ + "/controller.addr";
  cluster->state_dir_ = options.state_dir.empty() ? cluster->dir_ + "/state" : options.state_dir;
  cluster->own_state_dir_ = options.state_dir.empty();
  std::vector<std::string> args{absl::StrCat("--host=", options.host), "--port=0",
                                absl::StrCat("--port_file=", controller_file),
                                absl::StrCat("--client_token_file=", cluster->client_token_file_),
                                absl::StrCat("--worker_token_file=", cluster->worker_token_file_),
                                absl::StrCat("--state_dir=", cluster->state_dir_)};
  args.insert(args.end(), options.controller_args.begin(), options.controller_args.end());
  cluster->controller_bin_ = *controller_bin;
  cluster->worker_bin_ = *worker_bin;
  cluster->controller_args_ = args;
  auto pid = cluster->Spawn("controller", *controller_bin, args);
  if (!pid.ok()) return pid.status();
  auto address = AwaitAddressFile(controller_file, *pid, "controller", deadline);
  if (!address.ok()) return address.status();
  cluster->controller_address_ = *address;

  for (int i = 0; i < options.workers; ++i) {
    const std::string name = absl::StrCat("worker-", i);
    std::vector<std::string> wargs{absl::StrCat("--controller=", *address),
                                   absl::StrCat("--name=", name),
                                   absl::StrCat("--host=", options.host), "--port=0",
                                   absl::StrCat("--worker_token_file=", cluster->worker_token_file_),
                                   // A GPU each, where the host has as many (ignored without CUDA).
                                   absl::StrCat("--cuda_device=", i)};
    wargs.insert(wargs.end(), options.worker_args.begin(), options.worker_args.end());
    auto wpid = cluster->Spawn(name, *worker_bin, wargs);
    if (!wpid.ok()) return wpid.status();
    cluster->worker_args_[name] = std::move(wargs);
  }
  auto credentials = ClientCredentialsFromEnvironment();
  if (!credentials.ok()) return credentials.status();
  credentials->token = cluster->client_token();
  auto client = Client::Connect(*address, deadline - absl::Now(), *credentials);
  if (!client.ok()) return client.status();
  if (auto s = (*client)->WaitForWorkers(options.workers, deadline - absl::Now()); !s.ok()) {
    std::string exited;
    for (const auto& line : cluster->Reap()) absl::StrAppend(&exited, "; ", line);
    return absl::Status(s.code(), absl::StrCat(s.message(), exited));
  }
  return cluster;
}

std::vector<std::string> LocalCluster::Reap() {
  std::vector<std::string> lines;
  for (auto& p : processes_) {
    if (!p.running) continue;
    int status = 0;
    if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
      p.running = false;
      p.wait_status = status;
      lines.push_back(absl::StrCat(p.name, " (pid ", p.pid, ") ", DescribeExit(status)));
    }
  }
  return lines;
}

bool LocalCluster::controller_exited() const {
  for (const auto& p : processes_) {
    if (p.name == "controller") return !p.running;
  }
  return true;
}

absl::Status LocalCluster::RestartController(absl::Duration timeout) {
  auto it = std::find_if(processes_.begin(), processes_.end(), [](const Process& p) { return p.name == "controller"; });
  if (it == processes_.end() || it->running) return absl::FailedPreconditionError("the controller is running");
  processes_.erase(it);
  // The same port: workers and clients find it where it was.
  std::vector<std::string> args = controller_args_;
  const std::string port = controller_address_.substr(controller_address_.rfind(':') + 1);
  for (auto& a : args) {
    if (a == "--port=0") a = absl::StrCat("--port=", port);
    if (a == "--http_port=0" && controller_http_port_ > 0) a = absl::StrCat("--http_port=", controller_http_port_);
  }
  const std::string controller_file = dir_ + "/controller.addr";
  std::remove(controller_file.c_str());
  auto pid = Spawn("controller", controller_bin_, args);
  if (!pid.ok()) return pid.status();
  auto address = AwaitAddressFile(controller_file, *pid, "controller", absl::Now() + timeout);
  if (!address.ok()) return address.status();
  return absl::OkStatus();
}

std::vector<std::string> LocalCluster::exited_workers() const {
  std::vector<std::string> names;
  for (const auto& p : processes_) {
    if (!p.running && worker_args_.count(p.name)) names.push_back(p.name);
  }
  return names;
}

absl::StatusOr<pid_t> LocalCluster::RestartWorker(const std::string& name) {
  auto it = std::find_if(processes_.begin(), processes_.end(), [&](const Process& p) { return p.name == name; });
  if (it == processes_.end() || !worker_args_.count(name)) return absl::NotFoundError(absl::StrCat("no worker ", name));
  if (it->running) return absl::FailedPreconditionError(absl::StrCat(name, " is running"));
  processes_.erase(it);
  return Spawn(name, worker_bin_, worker_args_.at(name));
}

int LocalCluster::Stop(absl::Duration grace) {
  // Workers first, so they do not spend the grace period re-registering.
  for (auto it = processes_.rbegin(); it != processes_.rend(); ++it) {
    if (it->running) kill(it->pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  auto any_running = [&] {
    Reap();
    for (const auto& p : processes_) {
      if (p.running) return true;
    }
    return false;
  };
  while (any_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  int killed = 0;
  for (auto& p : processes_) {
    if (!p.running) continue;
    kill(p.pid, SIGKILL);
    waitpid(p.pid, &p.wait_status, 0);
    p.running = false;
    ++killed;
  }
  if (!dir_.empty()) {
    if (own_state_dir_) RemoveTree(state_dir_);
    std::remove((dir_ + "/controller.addr").c_str());
    std::remove(worker_token_file_.c_str());
    if (client_token_file_ == dir_ + "/client.token") std::remove(client_token_file_.c_str());
    std::remove((dir_ + "/owner.pid").c_str());
    rmdir(dir_.c_str());
    dir_.clear();
  }
  return killed;
}

LocalCluster::~LocalCluster() { Stop(); }

}  // namespace baton
