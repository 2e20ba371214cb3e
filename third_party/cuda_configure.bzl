"""Finds CUDA and NCCL, or stands in for them when they are absent.

With nccl.h and libnccl under CUDA_HOME (default /usr/local/cuda), @cuda//:nccl
holds the headers and link options. Without them (a bare machine), it is an
empty library that defines BATON_NO_NCCL, and the NCCL backend compiles to a
stub that says why it cannot run: the rest of Baton builds and tests as usual.
"""

def _cuda_configure_impl(ctx):
    home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    have = (ctx.path(home + "/include/nccl.h").exists and
            ctx.path(home + "/include/cuda_runtime.h").exists and
            ctx.path(home + "/lib64/libnccl.so").exists)
    if have:
        ctx.symlink(home + "/include", "include")
        ctx.file("BUILD", """
cc_library(
    name = "nccl",
    hdrs = glob(["include/**"]),
    includes = ["include", "include/cccl"],
    linkopts = [
        "-L{home}/lib64",
        "-Wl,-rpath,{home}/lib64",
        "-lnccl",
        "-lcudart",
    ],
    visibility = ["//visibility:public"],
)
""".format(home = home))
    else:
        ctx.file("BUILD", """
# CUDA/NCCL not found under {home}: the NCCL backend builds as a stub.
cc_library(
    name = "nccl",
    defines = ["BATON_NO_NCCL"],
    visibility = ["//visibility:public"],
)
""".format(home = home))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
