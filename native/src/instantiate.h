/* instantiate.h -- compile a family's type-generic template for float and double.
 *
 *     #define ORT_TEMPLATE "norm.inc"        (optionally ORT_TEMPLATE2 too)
 *     #include "instantiate.h"
 *
 * Each template sees T (element type) and SFX (f32/f64); FN(name) appends the suffix.
 * Families that need more per-type macros (a BLAS routine, an accumulator type) spell
 * the two instantiations out instead. */

#define T float
#define SFX f32
#include ORT_TEMPLATE
#ifdef ORT_TEMPLATE2
#include ORT_TEMPLATE2
#endif
#undef T
#undef SFX

#define T double
#define SFX f64
#include ORT_TEMPLATE
#ifdef ORT_TEMPLATE2
#include ORT_TEMPLATE2
#endif
#undef T
#undef SFX

#undef ORT_TEMPLATE
#undef ORT_TEMPLATE2
