from lucid.cli import main

main()
