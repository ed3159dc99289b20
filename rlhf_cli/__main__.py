from rlhf_cli.cli.app import main

main()
