/* tools_spec_hist.c: the options of speculative decoding's history store,
 * for `sluice run` (tools_spec.h; chat and serve have none). */
#include <string.h>

#include "tools_spec.h"

void tools_spec_usage_history(FILE *f)
{
    fprintf(f,
            "  --spec-history DIR  draft from earlier generations kept in DIR (one file per\n"
            "                   task kind and vocabulary), and add this one\n"
            "  --spec-kind NAME the task kind of the history (default 'default')\n"
            "  --spec-history-max N  tokens the history keeps, oldest dropped (default 65536)\n");
}

int tools_spec_arg_history(struct tools_args *a, const char *s, struct tools_spec *o)
{
    int bad;
    if (!strcmp(s, "--spec-history"))
        bad = tools_args_value(a, &o->history_dir);
    else if (!strcmp(s, "--spec-kind"))
        bad = tools_args_value(a, &o->kind);
    else if (!strcmp(s, "--spec-history-max"))
        bad = tools_args_u32(a, 2, 1u << 28, &o->history_max);
    else
        return tools_spec_arg(a, s, o);
    return bad ? -1 : 1;
}
