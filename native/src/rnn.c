/* rnn.c -- LSTM and GRU training kernels (spec §8), one direction per call.
 *
 * Layouts are ONNX Runtime's with num_directions dropped: X [S,B,I]; LSTM W [4H,I],
 * R [4H,H], bias [8H] = (Wb, Rb), peepholes [3H] = (Pi, Po, Pf), gate order [i,o,f,c];
 * GRU W [3H,I], R [3H,H], bias [6H] = (Wb, Rb), gate order [z,r,h]. States [B,H].
 * `reverse` runs time from S-1 down to 0 (HAll[t] is still the state at time t).
 *
 * The input projection of all steps is one GEMM ([S*B, I] x [I, gates]); each step
 * adds one recurrence GEMM ([B,H] x [H, gates]) and one fused pass over the gate
 * math. The backward collects the per-step pre-activation gradients dG [S,B,gates]
 * and finishes with whole-sequence GEMMs for dX, dW, dR and the bias sums.
 */
#include "common.h"

#define GEMM_OK(call) do { st = (call); if (st) goto done; } while (0)

#define T float
#define SFX f32
#include "rnn.inc"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "rnn.inc"
#undef T
#undef SFX
