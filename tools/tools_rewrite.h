/* tools_rewrite.h: a container written again with some changes (sluice
 * profile-attn: new attn.* keys; tools_transcode: another storage):
 *
 *   struct format_reader *r;
 *   struct format_writer *w;
 *   int ret = tools_rewrite_begin(src, dst, "attn.", &r, &w, &err);
 *   if (ret < 0)
 *       return ret;
 *   ret = format_writer_set_meta(w, ...);           // the changes
 *   for (uint32_t i = 0; ret == 0 && i < format_reader_n_tensors(r); i++)
 *       ret = tools_rewrite_tensor(r, i, w, &err);  // or a changed tensor
 *   return tools_rewrite_end(r, w, ret, &err);      // dst appears atomically
 *
 * dst may be src (replaced once finished). */
#ifndef SLUICE_TOOLS_REWRITE_H
#define SLUICE_TOOLS_REWRITE_H

#include <stdint.h>

#include "common.h"
#include "format.h"

/* Opens src, creates dst's writer and copies the config, the tokenizer and
 * every metadata key that does not start with `drop` (NULL: all). On error
 * nothing is left open and dst is untouched. */
int tools_rewrite_begin(const char *src, const char *dst, const char *drop,
                        struct format_reader **r, struct format_writer **w, struct sl_err *err);

/* t's description for format_writer_add_tensor (name, layer, role, encoding,
 * shape, act_scale, bits histogram; d->name points into t). */
void tools_rewrite_desc(const struct format_tensor_info *t, struct format_tensor_desc *d);

/* Tensor i of r into w unchanged (its checksum verified on the read). */
int tools_rewrite_tensor(const struct format_reader *r, uint32_t i, struct format_writer *w,
                         struct sl_err *err);

/* Finishes w if ret is 0, then frees w (removing its temporary file if
 * unfinished) and closes r. Returns ret, or finish's error. */
int tools_rewrite_end(struct format_reader *r, struct format_writer *w, int ret,
                      struct sl_err *err);

#endif
