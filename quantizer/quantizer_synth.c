/* quantizer_synth.c: synthetic models (being written). */
#include "quantizer.h"
