/* A plain C program that runs whatever tests/c/loader.c loads. */
int run_loaded(int argc, char **argv);

int main(int argc, char **argv)
{
    return run_loaded(argc, argv);
}
