from gpucloud.cli import main

main()
