/* spec_cost.c: the price of a verification in one-row steps (the cost
 * model that decides whether a draft tree is worth a verification and how
 * many rows it gets): a verification of n rows costs 1 + beta + alpha (n - 1)
 * one-row steps, fitted to the measured times of one-row steps (t1) and of
 * verifications (their ratio r = dt / t1).
 *
 * A busy machine only ever adds time, in bursts of a few milliseconds, to
 * some of the forwards: a mean, even of times capped at 1.25x the
 * expectation, read the price high at load 6-10 (kjv6L-1k: 50-260 drafts a
 * generation skipped; a fixed 0.1-0.2 a row did 3-7% better). So both are
 * priced from the fast end: a running low quantile (about the 20th
 * percentile), which a time above it moves up by a small relative step and
 * one below it down by a step four times larger, never past the time
 * itself. Bursts in fewer than ~80% of the forwards leave it on the
 * unloaded times; a lasting change moves it by 1.5-2% a forward up (or
 * 6-8% down) until it is followed. The line's two parameters move
 * together, the step split between the level at the mean size and the
 * slope by the size's distance from the mean (a sign-of-residual quantile
 * regression): the line moves by exactly the step at the size measured. */
#include "spec_internal.h"

#define SPEC_COST_WARM 4   /* observations of each kind taken more or less as they are first */
#define T1_UP 0.02         /* a one-row step above t1 raises it by at most this share */
#define T1_DOWN 0.08       /* one below lowers it by at most this share (20th percentile) */
#define V_UP 0.015         /* the same for a verification's price at its size */
#define V_DOWN 0.06
#define X_RATE 0.1         /* the sizes' running mean and variance */
#define BETA_PRIOR 0.3f    /* a verification's fixed cost at first (kjv6L-1k: 0.1-0.4) */
#define ALPHA_PRIOR 0.15f

void spec_cost_init(struct spec_cost *c, float row_cost)
{
    *c = (struct spec_cost){0};
    c->fixed = row_cost > 0;
    c->alpha = c->fixed ? row_cost : ALPHA_PRIOR;
    c->beta = c->fixed ? 0.0f : BETA_PRIOR;
}

/* v moved toward x by at most up (x above) or down (x below) times v, never past x */
static double toward(double v, double x, double up, double down)
{
    if (x > v)
        return x < v * (1 + up) ? x : v * (1 + up);
    return x > v * (1 - down) ? x : v * (1 - down);
}

void spec_cost_step(struct spec_cost *c, double dt)
{
    if (!(dt > 0))
        return;
    /* the first steps' mean (one fast or slow first step must not hold t1
     * for the rest of a short generation), then the low quantile */
    if (c->n1 < SPEC_COST_WARM) {
        c->n1++;
        c->t1 += (float)((dt - c->t1) / c->n1);
        return;
    }
    c->t1 = (float)toward(c->t1, dt, T1_UP, T1_DOWN);
}

void spec_cost_verify(struct spec_cost *c, uint32_t rows, double dt)
{
    if (c->fixed || c->t1 <= 0 || rows < 2 || !(dt > 0))
        return;
    double x = rows - 1;
    double r = dt / c->t1;
    r = r < 1 ? 1 : r > 9 ? 9 : r;
    /* the sizes' spread decides how much of a step goes to the slope */
    if (c->nv == 0)
        c->x_mean = x, c->x_var = 0;
    double dx = x - c->x_mean;
    c->x_mean += X_RATE * dx;
    c->x_var = (1 - X_RATE) * (c->x_var + X_RATE * dx * dx);
    double a = c->alpha, b = c->beta;
    double e = 1 + b + a * x, target;
    if (c->nv < SPEC_COST_WARM) {
        /* the prior is a guess: halfway to the first few */
        c->nv++;
        target = e + 0.5 * (r - e);
    } else {
        target = toward(e, r, V_UP, V_DOWN);
    }
    double d = target - e;
    /* the level at the mean size moves by d / (1 + k dx), the slope by
     * k d / (1 + k dx): the line at x moves by d (the first few: the level
     * alone, the sizes' spread is not known yet) */
    dx = x - c->x_mean;
    double k = c->nv < SPEC_COST_WARM ? 0 : dx / (c->x_var + 1.0);
    double da = k * d / (1 + k * dx);
    double dlevel = d / (1 + k * dx);
    a += da;
    b += dlevel - da * c->x_mean;
    a = a < 0.01 ? 0.01 : a > 2 ? 2 : a;
    b = b < 0 ? 0 : b > 2 ? 2 : b;
    c->alpha = (float)a;
    c->beta = (float)b;
}

int spec_cost_worth(const struct spec_cost *c, float gain, uint32_t rows)
{
    return rows > 1 && gain >= c->beta + c->alpha * (float)(rows - 1);
}

void spec_cost_skipped(struct spec_cost *c)
{
    /* a fixed cost measured high would stop verification for good (nothing
     * re-measures it while every tree is skipped): each skipped tree moves
     * it back toward the prior */
    if (c->fixed || c->beta <= BETA_PRIOR)
        return;
    c->beta += 0.1f * (BETA_PRIOR - c->beta);
}
