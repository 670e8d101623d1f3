/* Generate an answer with libllada, showing the answer as it forms on stderr.
 *
 *   cc -O2 -Icapi/include capi/examples/generate.c target/release/libllada.a \
 *      -lpthread -ldl -lm -o generate
 *   ./generate llada-tiny.lad "FILL:3000705000000920000040015000608000070060300000004000000800900010=" 64 64
 *
 * Arguments: artifact, prompt (the user's turn of a chat), then optionally the tokens to
 * generate (default 128) and the denoising steps (default: the model's). Prints the answer on stdout.
 */
#include <stdio.h>
#include <stdlib.h>

#include "llada.h"

/* Shows the committed prefix of the answer after each step (on stderr, so stdout holds only
 * the answer). Returning non-zero would cancel the generation. */
static int on_step(const llada_step *step, void *user_data) {
    (void)user_data;
    fprintf(stderr, "\rstep %u/%u: %s", step->step, step->steps, step->text);
    return 0;
}

static int fail(const char *what, llada_status status) {
    fprintf(stderr, "error: %s (status %d): %s\n", what, (int)status, llada_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL.lad PROMPT [GEN_LEN [STEPS]]\n", argv[0]);
        return 2;
    }
    llada_params params = llada_default_params();
    if (argc > 3) params.gen_len = (uint32_t)strtoul(argv[3], NULL, 10);
    if (argc > 4) params.steps = (uint32_t)strtoul(argv[4], NULL, 10);

    llada_model *model = NULL;
    llada_status status = llada_model_load(argv[1], &model);
    if (status != LLADA_STATUS_OK) return fail("loading the model", status);

    llada_session *session = NULL;
    status = llada_session_new(model, 0, &session);
    /* The session keeps what it needs of the model. */
    llada_model_free(model);
    if (status != LLADA_STATUS_OK) return fail("creating a session", status);

    llada_output output;
    status = llada_generate(session, argv[2], &params, on_step, NULL, &output);
    fprintf(stderr, "\n");
    if (status != LLADA_STATUS_OK) {
        llada_session_free(session);
        return fail("generating", status);
    }
    printf("%s\n", output.text);
    fprintf(stderr, "%zu tokens, %llu forward passes, %.2f s\n", output.n_tokens,
            (unsigned long long)output.forward_passes, output.seconds);
    llada_output_free(&output);
    llada_session_free(session);
    return 0;
}
