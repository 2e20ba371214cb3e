// See third_party/gloo_decl/README.md: nothing of gloo's algorithms is used.
#pragma once
#include "gloo/context.h"
