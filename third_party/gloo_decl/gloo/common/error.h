// See third_party/gloo_decl/README.md: gloo's exceptions reach Baton as
// c10::Error through c10d's Work, never as gloo's own types.
#pragma once
