/* spec_cost.c: the price of a verification in one-row steps (the cost
 * model that decides whether a draft tree is worth a verification and how
 * many rows it gets): a verification of n rows costs 1 + beta + alpha (n - 1)
 * one-row steps, fitted to the measured times of one-row steps (t1) and of
 * verifications: a least-squares line through (n - 1, dt / t1 - 1), the
 * sums decayed by SPEC_COST_RATE per round.
 *
 * A busy machine only ever adds time, in bursts of a few milliseconds: a
 * verification measured in one against one-row steps measured outside it
 * read 2-3x its price (kjv6L-1k: the verifications just before a skipped
 * tree took 2.2 ms, the others 1.0 ms, at 4-6 rows), which stopped
 * verification until the fixed cost decayed back, and the one-row steps
 * then run were the burst's slow ones. So a time counts for at most
 * SPEC_COST_CAP times what the model expects (t1 for a one-row step, the
 * fitted line for a verification): a burst moves the fit by a bounded step,
 * a lasting change of the machine still moves it, a little per round. The
 * first few times of each kind count as they are (the expectation is still
 * the prior's guess then). */
#include "spec_internal.h"

#define SPEC_COST_RATE 0.1 /* weight of one observation */
#define SPEC_COST_CAP 1.25 /* an observation counts for at most this times the expectation */
#define SPEC_COST_WARM 4   /* observations of each kind taken as they are first */
#define BETA_PRIOR 0.3f    /* a verification's fixed cost at first (kjv6L-1k: 0.1-0.4) */
#define ALPHA_PRIOR 0.15f

void spec_cost_init(struct spec_cost *c, float row_cost)
{
    *c = (struct spec_cost){0};
    c->fixed = row_cost > 0;
    c->alpha = c->fixed ? row_cost : ALPHA_PRIOR;
    c->beta = c->fixed ? 0.0f : BETA_PRIOR;
}

void spec_cost_step(struct spec_cost *c, double dt)
{
    if (!(dt > 0))
        return;
    /* the first steps' mean as it is (one fast or slow first step must not
     * hold t1 for the rest of a short generation: the cap lets it rise by
     * 2.5% a step), then the capped moving average */
    if (c->n1 < SPEC_COST_WARM) {
        c->n1++;
        c->t1 += (float)((dt - c->t1) / c->n1);
        return;
    }
    if (dt > SPEC_COST_CAP * c->t1)
        dt = SPEC_COST_CAP * c->t1;
    c->t1 += (float)(SPEC_COST_RATE * (dt - c->t1));
}

void spec_cost_verify(struct spec_cost *c, uint32_t rows, double dt)
{
    if (c->fixed || c->t1 <= 0 || rows < 2 || !(dt > 0))
        return;
    double x = rows - 1, keep = 1.0 - SPEC_COST_RATE;
    double expect = 1.0 + c->beta + c->alpha * x;
    double r = dt / c->t1;
    if (c->nv < SPEC_COST_WARM)
        c->nv++;
    else if (r > SPEC_COST_CAP * expect)
        r = SPEC_COST_CAP * expect;
    double y = r - 1.0;
    y = y < 0 ? 0 : y > 8 ? 8 : y;
    c->fit_w = keep * c->fit_w + 1;
    c->fit_x = keep * c->fit_x + x;
    c->fit_y = keep * c->fit_y + y;
    c->fit_xx = keep * c->fit_xx + x * x;
    c->fit_xy = keep * c->fit_xy + x * y;
    double mx = c->fit_x / c->fit_w, my = c->fit_y / c->fit_w;
    double var = c->fit_xx / c->fit_w - mx * mx, cov = c->fit_xy / c->fit_w - mx * my;
    /* the slope once the rounds' sizes spread (else the prior's, or the
     * last fitted one), the intercept through the mean */
    double a = var > 0.5 && c->fit_w > 3 ? cov / var : c->alpha;
    a = a < 0.01 ? 0.01 : a > 2 ? 2 : a;
    double b = my - a * mx;
    c->alpha = (float)a;
    c->beta = (float)(b < 0 ? 0 : b > 2 ? 2 : b);
}

int spec_cost_worth(const struct spec_cost *c, float gain, uint32_t rows)
{
    return rows > 1 && gain >= c->beta + c->alpha * (float)(rows - 1);
}

void spec_cost_skipped(struct spec_cost *c)
{
    /* a fixed cost measured high would stop verification for good (nothing
     * re-measures it while every tree is skipped): each skipped tree moves
     * it back toward the prior and weakens the old rounds' fit */
    if (c->fixed || c->beta <= BETA_PRIOR)
        return;
    c->beta += (float)SPEC_COST_RATE * (BETA_PRIOR - c->beta);
    double keep = 1.0 - SPEC_COST_RATE;
    c->fit_w *= keep, c->fit_x *= keep, c->fit_y *= keep;
    c->fit_xx *= keep, c->fit_xy *= keep;
}

/* ---- where a verification runs ----
 *
 * A session's verification splits its linears with the NPU device thread;
 * on a 2-core host shared with other work the second thread is often not
 * running when the split is posted (this Zen 5 host at load 5-16: 4-row
 * verifications x3.3-4.0 of a one-row step split against x2.0-2.4 on the
 * calling thread alone, in the same bench spec runs), and on a quiet one
 * the split can win. Each way has its own price (a spec_cost, both fed
 * every one-row step); the cheaper at the tree's size runs, the dearer one
 * every SPEC_WHERE_PROBE-th verification so that its price follows the
 * host. */

#define SPEC_WHERE_PROBE 16

void spec_where_init(struct spec_where *w, float row_cost, int have_device)
{
    *w = (struct spec_where){.have_device = have_device};
    spec_cost_init(&w->c[0], row_cost);
    spec_cost_init(&w->c[1], row_cost);
}

static float price(const struct spec_cost *c, uint32_t rows)
{
    return 1.0f + c->beta + c->alpha * (float)(rows - 1);
}

uint32_t spec_where_cheaper(const struct spec_where *w, uint32_t rows)
{
    /* a fixed price times nothing: the split, as before there was a choice */
    if (!w->have_device || w->c[0].fixed)
        return 0;
    return price(&w->c[1], rows) < price(&w->c[0], rows);
}

uint32_t spec_where_pick(struct spec_where *w, uint32_t rows)
{
    if (!w->have_device || w->c[0].fixed)
        return 0;
    if (w->n[0] < SPEC_COST_WARM || w->n[1] < SPEC_COST_WARM)
        return w->n[1] < w->n[0];
    uint32_t cheap = spec_where_cheaper(w, rows);
    return w->picks % SPEC_WHERE_PROBE == SPEC_WHERE_PROBE - 1 ? !cheap : cheap;
}

void spec_where_step(struct spec_where *w, double dt)
{
    spec_cost_step(&w->c[0], dt);
    spec_cost_step(&w->c[1], dt);
}

void spec_where_verify(struct spec_where *w, uint32_t on, uint32_t rows, double dt)
{
    spec_cost_verify(&w->c[on], rows, dt);
    if (w->n[on] < UINT32_MAX)
        w->n[on]++;
    w->picks++;
}
