/* tiny_q5.h: the small models several infer tests share: the synthetic
 * "tiny" shape in float (import_synth with a seed) and its 5-bit EdgeFlow
 * quantization (tensor budget, adaptive encoding), both in test_tmpdir(). */
#ifndef SLUICE_TEST_TINY_Q5_H
#define SLUICE_TEST_TINY_Q5_H

#include <stddef.h>
#include <stdint.h>

/* Writes DIR/tiny.sluice and DIR/tiny-q5.sluice and their paths into
 * float_model and q_model (each 4096 bytes). 0, or -1 with the reason on
 * stderr. */
int tiny_q5_models(uint32_t seed, char float_model[4096], char q_model[4096]);

#endif
