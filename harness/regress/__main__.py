from harness.regress.cli import main

main()
