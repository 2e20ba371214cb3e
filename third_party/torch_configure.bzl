"""LibTorch, CUDA's runtime headers and NCCL from Baton's Python environment.

PyPI's torch wheel (pinned in third_party/python/requirements.txt: 2.11.0, the
CUDA 13.0 build) carries LibTorch whole; NVIDIA's wheels beside it carry NCCL
and the CUDA runtime. This rule points at them where the environment lives
(third_party/python/env.sh: $BATON_ENV_ROOT/venv-<hash of the requirements>),
through symlinks: nothing of the 5 GB is copied into the build tree.

@torch//:torch  LibTorch (CPU and CUDA libraries, c10d with gloo), linked with
                an RPATH (DT_RPATH, which the loader also follows for the
                libraries' own dependencies: the wheel's libtorch_cuda names
                cuBLAS, cuDNN, NCCL ... with no path of its own) to the
                environment's directories.
@torch//:nccl   nccl.h and cuda_runtime.h from NVIDIA's wheels, and libnccl.
@torch//:python the environment's interpreter (a script), for tests and benches.
"""

_LIB_DIRS = [
    "torch/lib",
    "nvidia/cu13/lib",
    "nvidia/nccl/lib",
    "nvidia/cudnn/lib",
    "nvidia/cusparselt/lib",
    "nvidia/nvshmem/lib",
]

def _torch_configure_impl(ctx):
    requirements = ctx.path(ctx.attr.requirements)
    root = ctx.os.environ.get("BATON_ENV_ROOT", "/opt/baton")
    digest = ctx.execute(["sha256sum", str(requirements)])
    if digest.return_code != 0:
        fail("torch_configure: cannot hash {}: {}".format(requirements, digest.stderr))
    env = "{}/venv-{}".format(root, digest.stdout[:16])
    python = env + "/bin/python"
    if not ctx.path(env + "/.complete").exists:
        fail(("Baton's Python environment {} is missing or incomplete: run " +
              "./dev.sh build (or third_party/python/env.sh ensure) first").format(env))
    found = ctx.execute([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    if found.return_code != 0:
        fail("torch_configure: {} cannot say where its packages are: {}".format(python, found.stderr))
    site = found.stdout.strip()
    for d in ["torch/include", "torch/lib", "nvidia/nccl/include", "nvidia/cu13/include"] + _LIB_DIRS:
        if not ctx.path(site + "/" + d).exists:
            fail("torch_configure: {}/{} is missing: is torch 2.11.0 installed with its NVIDIA wheels?".format(site, d))

    # Every top-level entry of torch/include but the copies of protobuf
    # (google/) and pybind11 the wheel carries for its own build: they would
    # shadow Debian's protobuf, which our generated code is made for.
    for entry in ctx.path(site + "/torch/include").readdir():
        if entry.basename not in ["google", "pybind11"]:
            ctx.symlink(entry, "include/" + entry.basename)
    ctx.symlink(site + "/nvidia/nccl/include", "nccl_include")
    ctx.symlink(site + "/nvidia/cu13/include", "cuda_include")
    ctx.file("python", "#!/bin/sh\nexec {} \"$@\"\n".format(python), executable = True)
    lib_dirs = [site + "/" + d for d in _LIB_DIRS]
    rpaths = ",".join(["-rpath," + d for d in lib_dirs])
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["python"])

# LibTorch's headers. gloo's own headers are not in the wheel; c10d's
# ProcessGroupGloo.hpp is compiled against the declarations in
# //third_party/gloo_decl (see its README).
cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["USE_DISTRIBUTED", "USE_C10D_GLOO"],
)

# libtorch.so is a small stub over the others and must stay linked, as must
# libtorch_cuda (CUDA tensors and its NCCL process group; it runs on a machine
# without a GPU): hence no-as-needed.
cc_library(
    name = "torch",
    linkopts = [
        "-L{torch_lib}",
        "-Wl,--disable-new-dtags,{rpaths}",
        "-Wl,{rpath_links}",
        "-Wl,--push-state,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_cuda",
        "-lc10",
        "-lc10_cuda",
        "-Wl,--pop-state",
    ],
    deps = [":headers"],
)

cc_library(
    name = "nccl",
    hdrs = glob(["nccl_include/**/*.h", "cuda_include/**/*.h", "cuda_include/**/*.hpp", "cuda_include/**/*.cuh"]),
    includes = ["nccl_include", "cuda_include", "cuda_include/cccl"],
    linkopts = [
        "-Wl,--disable-new-dtags,{rpaths}",
        "-Wl,--push-state,--no-as-needed",
        "-L{site}/nvidia/nccl/lib",
        "-l:libnccl.so.2",
        "-L{site}/nvidia/cu13/lib",
        "-l:libcudart.so.13",
        "-Wl,--pop-state",
    ],
)
""".format(
        torch_lib = site + "/torch/lib",
        rpaths = rpaths,
        rpath_links = ",".join(["-rpath-link," + d for d in lib_dirs]),
        site = site,
    ))

torch_configure = repository_rule(
    implementation = _torch_configure_impl,
    attrs = {"requirements": attr.label(allow_single_file = True)},
    environ = ["BATON_ENV_ROOT"],
    local = True,
)
