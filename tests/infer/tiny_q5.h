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

/* A prompt of n ids for a vocabulary of `vocab` (BOS, then ids from 3 on
 * drawn by salt); malloc'd, NULL when out of memory. */
int *tiny_prompt(uint32_t n, uint32_t vocab, uint32_t salt);

/* Writes DIR/tiny-q5-static.sluice: float_model quantized as
 * tiny_q5_models does, with static activation scales calibrated through
 * the runtime's observer on a 200-token tiny_prompt(salt). 0, or -1 with
 * the reason on stderr. */
int tiny_q5_static_model(const char *float_model, uint32_t salt, char static_model[4096]);

struct infer_session;
/* A packed-resident session of model (its int8 copies dropped): a cold
 * start on an 8-token prompt, chunks of 32, batches up to 32, the NPU for
 * every linear unless no_npu; the test fails if it cannot start. */
struct infer_session *tiny_packed_session(const char *model, int no_npu);

#endif
