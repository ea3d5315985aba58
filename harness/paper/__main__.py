from harness.paper.cli import main

main()
